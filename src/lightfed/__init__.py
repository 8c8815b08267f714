"""lightfed: federated fine-tuning in kilobytes. `lightfed.load(PATH)` opens what a run trained (lightfed/trained.py)."""


def load(path, device: str = "cpu"):
    """An exported folder (`lightfed export`) or a finished run's folder -> a model to use: `.ask(text, question)` for
    a causal LM (FedNL's streams through its memory), `.predict(texts)` for a classifier (lightfed/trained.py)."""
    from lightfed.trained import load as _load
    return _load(path, device)
