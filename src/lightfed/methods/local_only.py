"""Local-only training (a baseline, no federation): each client trains its own LoRA adapters (and head)
from the same start, for the same steps per round as the federated methods, and never shares them:

    theta_k <- LocalTrain(theta_k),   theta_k = theta_0 (the broadcast) on a client's first round

Clients keep their tensors in ctx.state ("own.<name>"); the upload has no fields (only the engine's
sample count travels) and the server state never moves. Each client's model is its own (`personal`).
The global model is still broadcast every round (it never changes; the client only reads it once).
"""
from __future__ import annotations

from lightfed.methods import lora

OWN = "own."            # a client's own trained tensors, in ctx.state


class LocalOnly(lora.LoRA):
    name = "local_only"
    Options = lora.Options
    personalised = True
    federated = False

    def up_schema(self):
        return {}

    def personal(self, model, state, client_state):
        self.load(model, {n: client_state.get(OWN + n, state[n]) for n in state})

    def client_update(self, model, down, data, ctx):
        mine = all(OWN + n in ctx.state for n in self.shapes)
        start = {n: ctx.state[OWN + n] for n in self.shapes} if mine else down
        trained, stats = super().client_update(model, start, data, ctx)
        ctx.state.update({OWN + n: t.detach().clone() for n, t in trained.items()})
        return {}, stats

    def aggregate(self, state, updates, rnd):
        return state
