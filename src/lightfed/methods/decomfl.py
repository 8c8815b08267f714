"""DeComFL (Li et al., ICLR 2025: dimension-free communication in FL via zeroth-order optimisation).

The server draws one seed per local step, shared by every sampled client of the round; each
client runs K local ZO-SGD steps with P two-point (central) perturbations per step along those
shared directions and uploads the K x P scalars; the server AVERAGES the scalars per (step,
perturbation), sample-weighted, and the new global model is the replay of the averaged scalars
from the round's starting weights. The paper's downlink is that history: (round seed, K x P mean
scalars) per round, which a client replays; a client that missed rounds replays every missed
record (its download grows with the rounds it missed).

Relation to MeZO (methods/mezo.py, on the shared server methods/zo_server.py): MeZO here already derives the directions from a round seed
shared by all clients, so the client side, the uplink (K x P fp32 scalars + 8-byte digest +
`_n` (sample count)), the options (P, eps, trainable, max_steps, z) and the validation (the server
replays each upload and checks its digest, refusing forged or corrupted scalars: kept because the
client computes the digest for free; it costs the server one replay per client) are MeZO's, and
this class is a thin subclass. The only change is the aggregator: MeZO averages the replayed
client models; DeComFL replays the averaged scalars (`average_scalars`, `SeedReplay.replay_mean`). Because every client
walks the same directions z_{k,p} with plain ZO-SGD, a client's final model is
theta - sum_{k,p} (lr / P) g_{k,p} z_{k,p}, linear in its scalars, so the two are equal up to
float rounding (tests/test_zo_baselines.py checks it). They are NOT equal once the client
optimizer has state (momentum, Adam) or weight decay: then averaging scalars is DeComFL's
approximation, not FedAvg of models. (A client with fewer steps counts 0 for its missing steps.)

Wire: down = "seeds" by default, the paper's downlink (MeZO's: records of mean scalars since the round
whose model the client holds; first-time clients get the weights); `down = "model"` sends the weights
(fp32) + round seed to everyone, as MeZO does by default. Reported in stats either way, each the len() of
the message the server would send (MeZO.seed_down_bytes encodes it):
  down_seed_only_bytes     one round's record: round seed + K x P mean scalars;
  down_seed_history_bytes  what THIS client must download to catch up this round: one message with a
                           record per round since it last took part (rounds r .. t-1 after taking part
                           in r; rounds 1 .. t-1 for a first-time client, which starts from the initial
                           model), with its own K as each record's size. Remembered in ctx.state.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lightfed.methods import mezo

LAST = "decomfl_last_round"


@dataclass
class Options(mezo.Options):
    down: str = "seeds"         # the published downlink (model: the weights to everyone)


class DeComFL(mezo.MeZO):
    name = "decomfl"
    Options = Options
    TAG = 0x4465436F            # its own directions (never MeZO's), same derivation
    average_scalars = True      # the aggregator: replay of the mean scalars (SeedReplay.aggregate)

    def client_update(self, model, down, data, ctx):
        up, stats = super().client_update(model, down, data, ctx)
        last = int(ctx.state[LAST][0]) if LAST in ctx.state else 1
        stats["seed_records_missed"] = max(0, ctx.round - last)
        missed = stats["seed_records_missed"]
        stats["down_seed_history_bytes"] = self.seed_down_bytes(stats["steps"], missed) if missed else 0
        ctx.state[LAST] = torch.tensor([ctx.round], dtype=torch.int64)
        return up, stats


