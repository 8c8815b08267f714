"""The seed-replay zeroth-order method every ZO algorithm here shares (MeZO, DeComFL, FedSPZO, ZO-FLITE and its
split), and the two client steps they choose from. A method = this server + a client step + a block layout:

    method          client step            blocks (each perturbed with its own directions)    aggregator
    mezo            TwoPoint(P)            "all": the trainable weights                         mean of replayed models
    decomfl         TwoPoint(P)            "all"                                                replay of mean scalars
    fedspzo         Split(P1, Ps)          theta1 = f1's weights, theta2 = f2's (models/split)  either (`down`)
    zoflite         TwoPoint(P)            "all": FLITE's latent z (+ a trained head)            replay of mean scalars
    zoflite_split   Split(P1, Ps)          slices of z read by f1's / f2's layers (`views`)     replay of mean scalars

Client, per local step k on a fresh mini-batch: the step's directions are seeds derive(round_seed, k, block, p)
(every client of a round shares them, so the uplink is the scalars alone); it estimates one scalar per direction
from forwards only (no_grad, eval mode) and applies theta <- theta - coef z in the order `step.updates` gives
(zo.apply_update: two IEEE-rounded ops, the same on every machine). Plain ZO-SGD: no momentum, no weight decay,
so that scalars replay; a run that sets optimizer or weight_decay is refused.

Wire.  Up: one K x P float32 field per scalar kind of the step + "digest" (8 bytes: blake2b of the client's final
trainable tensors) + `_n`: ~4 K P + 40 bytes.
Down, `down = "model"`: the trainable tensors (fp32) + "round_seed", to every client. `down = "seeds"`: a client
that holds the global model of round r0 (it took part in r0 and its upload was accepted) gets kind "seeds/r0":
this round's seed + one record per round r0..t-1, the sample-weighted mean scalars of that round ("i.<field>":
K x P fp32), and replays them (catch_up); a first-time client, one whose last upload was refused or lost, or one
for which the records would outweigh the weights gets the model. The server keeps the records
("_log.<round>.<field>") and per client the round it holds ("_held") in its state, so checkpoints keep them.

Server: validate() replays the client's K steps from the global state with the same apply_update, refuses
non-finite results and a digest that differs ("replay digest mismatch"), and keeps the replayed model for
aggregate(): the sample-weighted mean of the replayed models (FedAvg of rebuilt models), or, with
`average_scalars` or `down = "seeds"`, the replay of the mean scalars (DeComFL's aggregator: what seed-only
clients rebuild bit for bit; equal to the mean of replayed models up to float rounding, directions being shared).
The digest catches corruption, tampering with the scalars and clients whose scalars do not rebuild their model;
it cannot catch a client that forges scalars and digests them honestly (robust aggregation of the scalars can).
"""
from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from lightfed import measure
from lightfed.config import ConfigError
from lightfed.data.tensors import size
from lightfed.methods.base import EXAMPLES, Method, Rejected, combine
from lightfed.optim import zeroth_order as zo
from lightfed.wire import Spec, WireError, encode, tensor_schema

DIGEST = "digest"
HELD, HELD_W = "held_round", "held."      # client state: round r0 whose global model it holds, and those weights
HELD_S, LOG = "_held", "_log."            # server state: per client r0 (-1: none); records _log.<round>.<field>
DOWNS = ("model", "seeds")


def check_common(o):
    """The options every seed-replay method has."""
    if not o.eps > 0:
        raise ConfigError(f"eps = {o.eps}: must be > 0")
    if o.max_steps < 1:
        raise ConfigError(f"max_steps = {o.max_steps}: must be >= 1")
    if o.z not in zo.DRAWS:
        raise ConfigError(f"z = {o.z!r}: use one of {', '.join(zo.DRAWS)}")
    if o.down not in DOWNS:
        raise ConfigError(f"down = {o.down!r}: use model or seeds")


def select_trainable(model, spec: str, who: str) -> list[str]:
    """requires_grad on the parameters matching `spec` ("all" or comma-separated name substrings) -> their names."""
    keys = None if spec == "all" else [s.strip() for s in spec.split(",") if s.strip()]
    for n, p in model.named_parameters():
        p.requires_grad = keys is None or any(s in n for s in keys)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    if not names:
        raise ConfigError(f"{who}: trainable = {spec!r} matches no parameter")
    return names


# --- the client steps ----------------------------------------------------------------------------
class TwoPoint:
    """MeZO's step on block "all": P directions z_p = z(derive(rs, k, 0, p)), each two-sided,
    g_p = (L(theta + eps z_p) - L(theta - eps z_p)) / (2 eps); then theta <- theta - (lr / P) g_p z_p."""

    def __init__(self, P: int, eps: float, lr: float):
        self.P, self.eps, self.lr = P, eps, lr

    def scalars(self) -> dict[str, int]:
        return {"g": self.P}

    def lrs(self) -> dict[str, float]:
        return {"g": self.lr}

    def bind(self, model, task: str):
        pass

    def updates(self, rs: int, k: int, row: dict) -> list[zo.Update]:
        return [("all", zo.derive(rs, k, 0, p), self.lr * g / self.P) for p, g in enumerate(row["g"])]

    def run(self, m: "SeedReplay", model, batch, k: int, rs: int, loss):
        """-> ({field: [g per direction]}, losses, {forward kind: forwards})"""
        row, losses = [], []
        for p in range(self.P):
            g, lp, lm = zo.two_point(lambda: loss(model, batch), model, m.block_params["all"], zo.derive(rs, k, 0, p),
                                     self.eps, m.owner_map, m.draw, m.in_place)
            row.append(zo.f32(g))
            losses += [lp, lm]
        return {"g": row}, losses, {"fwd": 2 * self.P}

    def measure(self, m, model, batch, loss) -> dict:
        """FLOPs per sample and activation memory of one forward (unperturbed, not counted in flops)."""
        exclude = measure.storage_ptrs(list(model.parameters()), list(model.buffers()), batch)
        with FlopCounterMode(display=False) as fc:
            _, act = measure.peak_live_bytes(lambda: loss(model, batch), exclude)
        return {"fwd": fc.get_total_flops() / size(batch), "activations": act}

    def memory(self, m, model, meas) -> dict:
        return {"params": measure.tensor_bytes(list(model.parameters()), list(model.buffers())),
                "activations": meas["activations"], "z": measure.z_bytes(m.block_params["all"])}


class Split:
    """FedSPZO's step (shared/spec/fedspzo.md) on blocks theta1 (f1) and theta2 (f2) of models/split:

        for a in 1..P1:                          z1_a from derive(rs, k, 1, a)
            for s in (+, -):                     f1 once at theta1 + s eps z1_a -> boundary y_s (reused)
                for q in 1..Ps:                  direction j = (2a + [s = -]) Ps + q of theta2
                    L(y_s; theta2 +- eps z2_j)   two f2 forwards; g2_j = (L+ - L-) / (2 eps)
                Lbar_s = mean of that side's 2 Ps losses
            g1_a = (Lbar_+ - Lbar_-) / (2 eps)
        theta1 <- theta1 - (lr / P1) g1_a z1_a, then theta2 <- theta2 - (lr2 / P2) g2_j z2_j,  P2 = 2 P1 Ps

    theta1's perturbation stays in force while f2 runs on its side's boundary (it matters only for weights f2
    shares with f1: SmolLM2's tied embedding / lm_head, held once per side). estimate = "independent" (the
    ablation): each block its own estimate with the other at rest (theta1 through the whole model; theta2 on the
    unperturbed boundary), the same directions, scalars, wire and replay."""

    def __init__(self, P1: int, Ps: int, eps: float, lr: float, lr2: float, n: int, estimate: str = "split"):
        self.P1, self.Ps, self.eps, self.lr, self.lr2, self.n, self.estimate = P1, Ps, eps, lr, lr2 or lr, n, estimate
        self.sp = None

    def scalars(self) -> dict[str, int]:
        return {"g1": self.P1, "g2": 2 * self.P1 * self.Ps}

    def lrs(self) -> dict[str, float]:
        return {"g1": self.lr, "g2": self.lr2}

    def bind(self, model, task: str):
        from lightfed.models.split import split
        self.sp = split(model, task, self.n)

    def updates(self, rs: int, k: int, row: dict) -> list[zo.Update]:
        P = self.scalars()
        return ([("theta1", zo.derive(rs, k, 1, a), self.lr * g / P["g1"]) for a, g in enumerate(row["g1"])]
                + [("theta2", zo.derive(rs, k, 2, j), self.lr2 * g / P["g2"]) for j, g in enumerate(row["g2"])])

    def run(self, m: "SeedReplay", model, batch, k: int, rs: int, loss):
        if self.estimate == "independent":
            return self._independent(m, model, batch, k, rs)
        sp, eps = self.sp, self.eps
        th1, th2 = m.block_params["theta1"], m.block_params["theta2"]
        g1, g2, losses = [], [0.0] * (2 * self.P1 * self.Ps), []
        for a in range(self.P1):
            s1 = zo.derive(rs, k, 1, a)
            side = []
            for i, sign in enumerate((1.0, -1.0)):
                with m.perturb(model, th1, s1, sign * eps):
                    y = sp.f1(batch)
                    ls = []
                    for q in range(self.Ps):
                        j = (2 * a + i) * self.Ps + q
                        g, lp, lm = zo.two_point(lambda: sp.f2_loss(y, batch), model, th2, zo.derive(rs, k, 2, j), eps,
                                                 m.owner_map, m.draw, m.in_place)
                        g2[j] = zo.f32(g)
                        ls += [lp, lm]
                    del y
                side.append(sum(ls) / len(ls))
                losses += ls
            g1.append(zo.f32((side[0] - side[1]) / (2 * eps)))
        return {"g1": g1, "g2": g2}, losses, {"f1": 2 * self.P1, "f2": 4 * self.P1 * self.Ps}

    def _independent(self, m, model, batch, k, rs):
        sp, eps = self.sp, self.eps
        th1, th2 = m.block_params["theta1"], m.block_params["theta2"]
        g1, g2, losses = [], [], []
        for a in range(self.P1):                 # theta1 alone, through the whole model
            g, lp, lm = zo.two_point(lambda: sp.f2_loss(sp.f1(batch), batch), model, th1, zo.derive(rs, k, 1, a), eps,
                                     m.owner_map, m.draw, m.in_place)
            g1.append(zo.f32(g))
            losses += [lp, lm]
        y = sp.f1(batch)                          # theta2 alone, on the unperturbed boundary
        for j in range(2 * self.P1 * self.Ps):
            g, lp, lm = zo.two_point(lambda: sp.f2_loss(y, batch), model, th2, zo.derive(rs, k, 2, j), eps,
                                     m.owner_map, m.draw, m.in_place)
            g2.append(zo.f32(g))
            losses += [lp, lm]
        return {"g1": g1, "g2": g2}, losses, {"f1": 2 * self.P1 + 1, "f2": 2 * self.P1 + 4 * self.P1 * self.Ps}

    def measure(self, m, model, batch, loss) -> dict:
        sp = self.sp
        exclude = measure.storage_ptrs(list(model.parameters()), list(model.buffers()), batch)
        with FlopCounterMode(display=False) as fc:
            y, act1 = measure.peak_live_bytes(lambda: sp.f1(batch), exclude)
        fl1 = fc.get_total_flops()
        with FlopCounterMode(display=False) as fc:
            _, act2 = measure.peak_live_bytes(lambda: sp.f2_loss(y, batch), exclude | measure.storage_ptrs(y.args, y.kwargs))
        fl2 = fc.get_total_flops()
        return {"f1": fl1 / size(batch), "f2": fl2 / size(batch), "activations": max(act1, act2),
                "boundary": measure.tensor_bytes(y.args, y.kwargs)}

    def memory(self, m, model, meas) -> dict:
        th1, th2 = m.block_params["theta1"], m.block_params["theta2"]
        held = {n: th1[n] for n in self.sp.shared if n in th1}
        z = max(measure.z_bytes(th1), measure.z_bytes(th2, held))
        return {"params": measure.tensor_bytes(list(model.parameters()), list(model.buffers())),
                "activations": meas["activations"], "boundary": meas["boundary"], "z": z}


def split_blocks(model, task: str, n: int, names: list[str]) -> dict[str, list[str]]:
    """theta1 / theta2: the trainable `names` that f1 / f2 of models/split read."""
    from lightfed.models.split import split
    sp, keep = split(model, task, n), set(names)
    return {"theta1": [x for x in sp.f1_names if x in keep], "theta2": [x for x in sp.f2_names if x in keep]}


# --- the method: server, codec and client loop ------------------------------------------------------
class SeedReplay(Method):
    """A method chooses its client step (`make_step`: TwoPoint or Split) and, in prepare(), sets self.names (the
    trainable tensors, in order) and self.layout ({block: names}); `views` maps them onto tensors (overridden
    where blocks are slices)."""
    dp = "scalars"
    zeroth_order = True
    optimizer = ""              # plain ZO-SGD, so that scalars replay
    optimizer_why = "plain zeroth-order SGD: momentum, Adam or weight decay would stop its scalars replaying"
    TAG = 0                     # mixes the round seed, so two ZO methods never share directions
    lr = 1e-5                   # on the weights: the calibrations' safe choice (benchmarks/results/zoflite_*calibrate.md:
                                # best on MiniLM from a probed head, stable but slow on SmolLM2's prompts, where 3e-4 won)
    average_scalars = False     # True (DeComFL): the new model is the replay of the mean scalars
    in_place = False            # perturb by hooks on the owners (nothing written); True: in place (FLITE's z)

    def __init__(self, opts, cfg):
        super().__init__(opts, cfg)
        self.step = self.make_step()

    def make_step(self):
        raise NotImplementedError

    def perturb(self, model, params, seed, scale):
        """The context a perturbed forward runs in (zo.perturbation, as this method's options say)."""
        return zo.perturbation(model, params, seed, scale, self.owner_map, self.draw, self.in_place)

    def blocks(self) -> dict[str, list[str]]:
        return self.layout

    def views(self, tensors: dict) -> dict[str, dict[str, torch.Tensor]]:
        """{block: {name: tensor}} over `tensors` (model parameters or a state copy); updates write through."""
        return {b: {n: tensors[n] for n in ns} for b, ns in self.layout.items()}

    def scalars(self) -> dict[str, int]:
        """Uplink scalar field -> directions per step."""
        return self.step.scalars()

    def lrs(self) -> dict[str, float]:
        return self.step.lrs()

    def step_updates(self, round_seed: int, k: int, row: dict[str, list[float]]) -> list[zo.Update]:
        """Step k's updates, in the order clients apply and the server replays them."""
        return self.step.updates(round_seed, k, row)

    def _bind(self, model):
        """Per-model lookups: parameters by block, which modules hold each parameter, the step's split."""
        self.block_params = self.views(dict(model.named_parameters()))
        self.owner_map = zo.owners(model)
        self.step.bind(model, self.cfg.task)

    @property
    def draw(self) -> str:
        return self.opts.z

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
        dp = ctx.step_noise(K) if ctx.step_noise is not None else None
        try:
            with torch.no_grad():
                for k, b in enumerate(zo.step_batches(data, c.batch_size, K, ctx.generator())):
                    if meas is None:      # every update measures its own first batch: memory depends on
                        meas = self.step.measure(self, model, b, ctx.loss)   # content (HF drops an all-ones mask)
                    row, losses, fwds = self.step.run(self, model, b, k, rs, ctx.loss)
                    if dp is not None:            # clip + noise before applying: the replay sees what we applied
                        row = dp(row)
                    for f in rows:
                        rows[f].append(row[f])
                    for kind, m in fwds.items():
                        fwd_samples[kind] = fwd_samples.get(kind, 0) + m * size(b)
                    for blk, seed, coef in self.step_updates(rs, k, row):
                        zo.apply_update(self.block_params[blk], seed, coef, self.draw)
                    loss_sum += sum(losses) / len(losses)
                    samples += size(b)
        finally:
            model.train(was)
        up = {f: torch.tensor(r, dtype=torch.float32).reshape(K, -1) for f, r in rows.items()}
        up[DIGEST] = zo.digest(self.trainable(model))
        flops = {kind: meas[kind] * m for kind, m in fwd_samples.items()}   # FLOPs per sample x samples
        stats = {"steps": K, "samples": samples, "train_loss": loss_sum / K, "loss": loss_sum / K,
                 "flops": sum(flops.values()), **{f"flops_{kind}": v for kind, v in flops.items() if kind != "fwd"},
                 "forwards_per_step": fwds, "memory_accounted": self.step.memory(self, model, meas),
                 "down_seed_only_bytes": self.seed_down_bytes(K), "down_records": records,
                 **({"dp_clipped_steps": dp.clipped, "dp_norm": max(dp.norms)} if dp is not None else {})}
        return up, stats

    # --- 4. aggregator ---------------------------------------------------------------------------
    def updates_of(self, rnd: int, fields) -> list[zo.Update]:
        rs = self.round_seed(rnd)
        tab = {f: fields[f].tolist() for f in self.scalars()}
        K = len(next(iter(tab.values())))
        return [u for k in range(K) for u in self.step_updates(rs, k, {f: tab[f][k] for f in tab})]

    @torch.no_grad()
    def replay(self, state, rnd: int, fields):
        """The client's final trainable tensors, rebuilt from the global state and its scalars."""
        out = {n: state[n].detach().clone() for n in self.names}
        views = self.views(out)
        for block, seed, coef in self.updates_of(rnd, fields):
            zo.apply_update(views[block], seed, coef, self.draw)
        return out

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
