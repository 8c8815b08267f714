"""MeZO-style federated zeroth-order fine-tuning (Malladi et al., 2023; seeds + scalars as in
DeComFL / FedKSeed): the uniform single-block baseline and ablation of FedSPZO, and the home of
the server side every seed-replay ZO method shares (FedSPZO subclasses it).

Client, per local step on a fresh mini-batch: P directions z_p on ALL trainable weights, each
two-sided, g_p = (L(theta + eps z_p) - L(theta - eps z_p)) / (2 eps); then
theta <- theta - (lr / P) g_p z_p for p = 1..P (plain ZO-SGD: no momentum, no weight decay, so
that scalars replay; cfg.optimizer is ignored). Forwards only, under no_grad, in eval mode.
Seeds: a round seed broadcast by the server; direction p of step k uses derive(round_seed, k,
block, p): every client of a round shares the directions (as DeComFL), so the uplink is the
scalars alone.

Wire.  Up: "g" (K x P float32) + "digest" (8 bytes: blake2b of the client's final trainable
weights) + `_n` (sample count): 4 K P + ~40 bytes.
Down, `down = "model"` (default): the trainable weights (fp32) + "round_seed", to every client.
`down = "seeds"`: a client that holds the global model of round r0 (it took part in r0 and its
upload was accepted) gets kind "seeds/r0": this round's seed + one record per round r0..t-1, the
sample-weighted mean scalars of that round ("i.g": K x P fp32), and replays them (catch_up); a
first-time client, one whose last upload was refused or lost, or one for which the records
would outweigh the weights gets the model. The server's new global model is then the replay of
the mean scalars (as DeComFL), which is what the clients rebuild, bit for bit; because the
directions are shared it equals the mean of the replayed client models up to float rounding.
The server keeps the records ("_log.<round>.<field>") and per client the round it holds
("_held") in its state, so they are checkpointed with it. `seed_down_bytes(K)` is one record's size.

Server: validate() replays the client's K steps from the global state with the same
apply_update (optim/zeroth_order.py), refuses non-finite results and a digest that differs
("replay digest mismatch"), and keeps the replayed model for aggregate(), which takes the
sample-weighted mean of the replayed models (FedAvg of rebuilt models). The digest catches
corruption, tampering with the scalars and clients whose scalars do not reproduce their model;
it cannot catch a client that forges scalars and digests them honestly.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode

from lightfed import privacy
from lightfed.config import ConfigError
from lightfed.data.tensors import size
from lightfed.methods.base import EXAMPLES, Method, Rejected, combine
from lightfed.optim import zeroth_order as zo
from lightfed.wire import Spec, WireError, encode, tensor_schema

DIGEST = "digest"
HELD, HELD_W = "held_round", "held."      # client state: round r0 whose global model it holds, and those weights
HELD_S, LOG = "_held", "_log."            # server state: per client r0 (-1: none); records _log.<round>.<field>
DOWNS = ("model", "seeds")


def _check_common(o):
    if not o.eps > 0:
        raise ConfigError(f"eps = {o.eps}: must be > 0")
    if o.max_steps < 1:
        raise ConfigError(f"max_steps = {o.max_steps}: must be >= 1")
    if o.z not in ("portable", "fast"):
        raise ConfigError(f"z = {o.z!r}: use portable or fast")
    if o.down not in DOWNS:
        raise ConfigError(f"down = {o.down!r}: use model or seeds")


@dataclass
class Options:
    P: int = 1                  # directions per step
    eps: float = 1e-3           # perturbation scale
    trainable: str = "all"      # "all", or comma-separated substrings of parameter names
    max_steps: int = 100_000    # the server refuses uploads claiming more local steps (replay cost)
    z: str = "portable"         # portable: same z on any CPU; fast: ~4x faster draws, like CPUs only
    down: str = "model"         # model | seeds (records of mean scalars for clients holding an earlier model)

    def check(self):
        _check_common(self)
        if self.P < 1:
            raise ConfigError(f"P = {self.P}: need at least one direction per step")


class MeZO(Method):
    name = "mezo"
    dp = "scalars"
    Options = Options
    TAG = 0x4D655A4F            # mixes the round seed, so two ZO methods never share directions
    lr = 1e-5                   # on the weights: the calibrations' safe choice (benchmarks/results/zoflite_*calibrate.md:
                                # best on MiniLM from a probed head, stable but slow on SmolLM2's prompts, where 3e-4 won)
    average_scalars = False     # True (DeComFL): the new model is the replay of the mean scalars
    in_place = False            # perturb by hooks on the owners (nothing written); True: in place (ZO-FLITE's z)

    def perturb(self, model, params, seed, scale):
        """The context a perturbed forward runs in (zo.perturbation, as this method's options say)."""
        return zo.perturbation(model, params, seed, scale, self.owner_map, self.fast, self.in_place)

    # --- what a subclass changes -----------------------------------------------------------------
    def blocks(self) -> dict[str, list[str]]:
        """Block name -> trainable parameter names (each block perturbed with its own directions)."""
        return {"all": self.names}

    def scalars(self) -> dict[str, int]:
        """Uplink scalar field -> directions per step."""
        return {"g": self.opts.P}

    def lrs(self) -> dict[str, float]:
        return {"g": self.cfg.lr}

    def step_updates(self, round_seed: int, k: int, row: dict[str, list[float]]) -> list[zo.Update]:
        """Step k's updates, in the order clients apply and the server replays them."""
        P, lr = self.opts.P, self.lrs()["g"]
        return [("all", zo.derive(round_seed, k, 0, p), lr * g / P) for p, g in enumerate(row["g"])]

    def measure(self, model, batch, loss) -> dict:
        """FLOPs and memory of one forward of each kind on `batch` (unperturbed, not counted in flops)."""
        exclude = zo.storage_ptrs(list(model.parameters()), list(model.buffers()), batch)
        with FlopCounterMode(display=False) as fc:
            _, act = zo.peak_live_bytes(lambda: loss(model, batch), exclude)
        return {"fwd": fc.get_total_flops() / size(batch), "activations": act}

    def local_step(self, model, batch, k, round_seed, loss):
        """-> ({field: [g per direction]}, losses, {forward kind: forwards})."""
        params = self.block_params["all"]
        row, losses = [], []
        for p in range(self.opts.P):
            g, lp, lm = zo.two_point(lambda: loss(model, batch), model, params, zo.derive(round_seed, k, 0, p),
                                     self.opts.eps, self.owner_map, self.fast, self.in_place)
            row.append(zo.f32(g))
            losses += [lp, lm]
        return {"g": row}, losses, {"fwd": 2 * self.opts.P}

    def memory(self, model, meas) -> dict:
        return {"params": zo.tensor_bytes(list(model.parameters()), list(model.buffers())),
                "activations": meas["activations"], "z": zo.z_bytes(self.block_params["all"])}

    # --- 1. parameterization ---------------------------------------------------------------------
    def prepare(self, model):
        spec = self.opts.trainable
        keys = None if spec == "all" else [s.strip() for s in spec.split(",") if s.strip()]
        for n, p in model.named_parameters():
            p.requires_grad = keys is None or any(s in n for s in keys)
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        if not self.names:
            raise ConfigError(f"{self.name}: trainable = {spec!r} matches no parameter")
        return super().prepare(model)

    def _bind(self, model):
        """Per-model lookups: parameters by block, and which modules hold each parameter."""
        named = dict(model.named_parameters())
        self.block_params = {b: {n: named[n] for n in ns} for b, ns in self.blocks().items()}
        self.owner_map = zo.owners(model)

    @property
    def fast(self) -> bool:
        return self.opts.z == "fast"

    @property
    def seeds_down(self) -> bool:
        return self.opts.down == "seeds"

    def init_state(self, model):
        state = super().init_state(model)
        if self.seeds_down:
            state[HELD_S] = torch.full((self.cfg.clients,), -1, dtype=torch.int64)
        return state

    def round_seed(self, rnd: int) -> int:
        return zo.derive(self.cfg.seed, rnd, self.TAG)

    # --- 3. codec --------------------------------------------------------------------------------
    def down_schema(self):
        return {**tensor_schema({n: torch.empty(s) for n, s in self.shapes.items()}, "fp32"),
                "round_seed": Spec("int", lo=0, hi=2**63 - 1)}

    def broadcast(self, state, rnd):
        return {**{n: state[n] for n in self.names}, "round_seed": self.round_seed(rnd)}

    def seeds_schema(self, n: int):
        """The seed-only downlink with n records (K x P each; K may differ per round, 0 for a kept round)."""
        return {"round_seed": Spec("int", lo=0, hi=2**63 - 1),
                **{f"{i}.{f}": Spec("tensor", None, "fp32") for i in range(n) for f in self.scalars()}}

    def downlink(self, state, rnd, cid):
        r0 = int(state[HELD_S][cid]) if self.seeds_down and cid is not None else -1
        if r0 < 1:
            return super().downlink(state, rnd, cid)
        recs = {f"{i}.{f}": state[f"{LOG}{r}.{f}"] for i, r in enumerate(range(r0, rnd)) for f in self.scalars()}
        if sum(v.numel() for v in recs.values()) >= sum(state[n].numel() for n in self.names):
            return super().downlink(state, rnd, cid)          # catching up would cost more than the weights
        return f"seeds/{r0}", {"round_seed": self.round_seed(rnd), **recs}, self.seeds_schema(rnd - r0)

    def down_kinds(self, ctx):
        kinds = super().down_kinds(ctx)
        if self.seeds_down and HELD in ctx.state:
            r0 = int(ctx.state[HELD][0])
            kinds[f"seeds/{r0}"] = self.seeds_schema(ctx.round - r0)
        return kinds

    def catch_up(self, ctx, down) -> dict:
        """Client: the global model of this round, from the one it holds and the records since."""
        r0 = int(ctx.state[HELD][0])
        w = {n: ctx.state[HELD_W + n] for n in self.names}
        for i, r in enumerate(range(r0, ctx.round)):
            rec = {f: down[f"{i}.{f}"] for f in self.scalars()}
            for f, P in self.scalars().items():
                if rec[f].dim() != 2 or rec[f].shape[1] != P or rec[f].shape[0] > self.opts.max_steps:
                    raise WireError(f"{i}.{f}", f"seed record shape {tuple(rec[f].shape)}, expected (K <= "
                                    f"{self.opts.max_steps}, {P})")
            w = self.replay(w, r, rec)
        return w

    def up_schema(self):
        K = self.cfg.local_steps if self.cfg.local_steps > 0 else None   # else: checked in validate
        return {**{f: Spec("tensor", None if K is None else (K, P), "fp32") for f, P in self.scalars().items()},
                DIGEST: Spec("bytes", max_len=8)}

    def seed_down_bytes(self, K: int, records: int = 1) -> int:
        """len() of a seed-only downlink carrying `records` rounds of K steps: the message the server would
        send (seeds_schema's field names and kind), encoded with zeros in place of the scalars."""
        fields = {"round_seed": 0, **{f"{i}.{f}": torch.zeros(K, P) for i in range(records) for f, P in self.scalars().items()}}
        return len(encode(fields, self.seeds_schema(records), kind=f"{self.name}/seeds/0"))

    # --- 2. local optimizer ----------------------------------------------------------------------
    def client_update(self, model, down, data, ctx):
        records = 0                              # seed records replayed (0: the weights came)
        if self.names[0] not in down:            # a seed-only downlink: rebuild the model it stands for
            records = ctx.round - int(ctx.state[HELD][0])
            down = {**self.catch_up(ctx, down), "round_seed": down["round_seed"]}
        self.load(model, down)
        self._bind(model)
        if self.seeds_down:                       # keep this round's global model: next time records suffice
            ctx.state[HELD] = torch.tensor([ctx.round], dtype=torch.int64)
            ctx.state.update({HELD_W + n: down[n].detach().clone() for n in self.names})
        c = ctx.cfg
        n = size(data)
        K = zo.num_steps(n, c.batch_size, c.local_steps, c.local_epochs)
        rs = down["round_seed"]
        was = model.training
        model.eval()
        rows = {f: [] for f in self.scalars()}
        fwd_samples: dict[str, int] = {}
        loss_sum, samples, meas = 0.0, 0, None
        dp = privacy.StepNoise(c, ctx.seed, K) if c.dp_clip > 0 else None
        try:
            with torch.no_grad():
                for k, b in enumerate(zo.step_batches(data, c.batch_size, K, ctx.generator())):
                    if meas is None:      # every update measures its own first batch: memory depends on
                        meas = self.measure(model, b, ctx.loss)   # content (HF drops an all-ones mask), not only shape
                    row, losses, fwds = self.local_step(model, b, k, rs, ctx.loss)
                    if dp is not None:            # clip + noise before applying: the replay sees what we applied
                        row = dp(row)
                    for f in rows:
                        rows[f].append(row[f])
                    for kind, m in fwds.items():
                        fwd_samples[kind] = fwd_samples.get(kind, 0) + m * size(b)
                    for blk, seed, coef in self.step_updates(rs, k, row):
                        zo.apply_update(self.block_params[blk], seed, coef, self.fast)
                    loss_sum += sum(losses) / len(losses)
                    samples += size(b)
        finally:
            model.train(was)
        up = {f: torch.tensor(r, dtype=torch.float32).reshape(K, -1) for f, r in rows.items()}
        up[DIGEST] = zo.digest(self.trainable(model))
        flops = {kind: meas[kind] * m for kind, m in fwd_samples.items()}   # FLOPs per sample x samples
        stats = {"steps": K, "samples": samples, "train_loss": loss_sum / K, "loss": loss_sum / K,
                 "flops": sum(flops.values()), **{f"flops_{kind}": v for kind, v in flops.items() if kind != "fwd"},
                 "forwards_per_step": fwds, "memory_accounted": self.memory(model, meas),
                 "down_seed_only_bytes": self.seed_down_bytes(K), "down_records": records,
                 **({"dp_clipped_steps": dp.clipped, "dp_norm": max(dp.norms)} if dp is not None else {})}
        return up, stats

    # --- 4. aggregator ---------------------------------------------------------------------------
    def updates_of(self, rnd: int, fields) -> list[zo.Update]:
        rs = self.round_seed(rnd)
        tab = {f: fields[f].tolist() for f in self.scalars()}
        K = len(next(iter(tab.values())))
        return [u for k in range(K) for u in self.step_updates(rs, k, {f: tab[f][k] for f in tab})]

    def replay(self, state, rnd: int, fields):
        """The client's final trainable weights, rebuilt from the global state and its scalars."""
        return zo.replay({n: state[n] for n in self.names}, self.blocks(), self.updates_of(rnd, fields), self.fast)

    def validate(self, state, fields, rnd):
        shapes = {f: tuple(fields[f].shape) for f in self.scalars()}
        first = next(iter(shapes.values()))
        K = first[0] if len(first) == 2 else -1
        for f, P in self.scalars().items():
            if shapes[f] != (K, P):
                raise Rejected(f"{f}: shape {shapes[f]}, expected (K, {P}) like the other fields")
        n = int(fields.get(EXAMPLES, self.cfg.max_examples))      # the engine checked it against max_examples
        most = min(self.steps_allowed(n), self.opts.max_steps)     # bounded before any replay
        if not 1 <= K <= most:
            raise Rejected(f"{K} local steps claimed: this round's config allows 1..{most} "
                           f"(local_steps, or local_epochs x {n} examples / batch_size; max_steps)")
        if not all(torch.isfinite(fields[f]).all() for f in self.scalars()):
            raise Rejected("non-finite scalars")
        if len(fields[DIGEST]) != 8:
            raise Rejected(f"digest is {len(fields[DIGEST])} bytes, expected 8")
        new = self.replay(state, rnd, fields)
        if not all(torch.isfinite(v).all() for v in new.values()):
            raise Rejected("replay gives non-finite weights")
        if zo.digest(new) != fields[DIGEST]:
            raise Rejected("replay digest mismatch: the scalars do not rebuild the client's model")
        cache = getattr(self, "_cache", None)
        if cache is None or cache[0] != (rnd, id(state)):
            self._cache = cache = ((rnd, id(state)), {})
        cache[1][id(fields)] = (fields, new)

    def _replayed(self, state, fields, rnd):
        cache = getattr(self, "_cache", None)
        hit = cache[1].get(id(fields)) if cache is not None and cache[0] == (rnd, id(state)) else None
        if hit is None or hit[0] is not fields:
            self.validate(state, fields, rnd)
            hit = self._cache[1][id(fields)]
        return hit[1]

    def aggregate(self, state, updates, rnd):
        if not (self.average_scalars or self.seeds_down):   # FedAvg of the replayed client models
            rebuilt = [(self._replayed(state, f, rnd), w) for f, w in updates]
            self._cache = None
            return combine(rebuilt, self.names, self.cfg.robust, ref=state)
        for f, _ in updates:                  # each upload validated (digest) once; the engine's validate cached it
            self._replayed(state, f, rnd)
        self._cache = None
        mean = self.mean_scalars(updates)
        new = self.replay(state, rnd, mean)
        if self.seeds_down:                   # the round's record, and what the server remembers
            new.update({k: v for k, v in state.items() if k.startswith("_")})
            new.update({f"{LOG}{rnd}.{f}": v for f, v in mean.items()})
        return new

    def after_round(self, state, rnd, accepted, sampled):
        if not self.seeds_down:
            return state
        state = dict(state)
        for f, P in self.scalars().items():   # a round that kept the state: an empty record
            state.setdefault(f"{LOG}{rnd}.{f}", torch.zeros(0, P))
        held = state[HELD_S].clone()
        held[sampled] = -1                    # refused or lost: the model next time
        held[accepted] = rnd
        state[HELD_S] = held
        return state

    def replay_mean(self, state, rnd: int, updates) -> dict:
        """What a seed-only client computes: replay of the sample-weighted mean scalars."""
        return self.replay(state, rnd, self.mean_scalars(updates))

    def mean_scalars(self, updates) -> dict:
        """Sample-weighted mean scalars, per step and direction (float64 sums, stored as float32; a
        client with fewer steps counts 0 for the missing ones). With cfg.robust other than mean: that
        rule per step and direction (median / trimmed mean across clients; clip: each client's scalars
        scaled to norm <= C), on the scalars padded with 0 to the longest K."""
        total = sum(w for _, w in updates)
        K = max(f[next(iter(self.scalars()))].shape[0] for f, _ in updates)
        if self.cfg.robust != "mean":
            pad = [({fn: torch.cat([f[fn].float(), torch.zeros(K - f[fn].shape[0], P)]) for fn, P in self.scalars().items()}, w)
                   for f, w in updates]
            return combine(pad, list(self.scalars()), self.cfg.robust)
        mean = {}
        for fname, P in self.scalars().items():
            acc = torch.zeros(K, P, dtype=torch.float64)
            for f, w in updates:
                acc[: f[fname].shape[0]] += f[fname].double() * (w / total)
            mean[fname] = acc.float()
        return mean
