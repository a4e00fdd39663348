"""Advantages for a file of rollouts, on CPU, with no torch: Parquet → Arrow → advantages.

One row per response, with per-token list columns (rewards, the critic's values, the
attention concentration recorded at rollout time) and a group id per prompt. This:

1. writes such a file (your rollout workers would);
2. adds Comp-GAE advantages and returns as two new list columns (``arrow.compute_advantages``);
3. does the same on plain NumPy arrays: a list column's offsets are ``cu_seqlens``;
4. computes GRPO advantages from one score per response, for a critic-free run.

Needs the [arrow] extra (pyarrow):  python examples/pipeline.py
(For large files, the command ``comppo-core advantages IN.parquet -o OUT.parquet`` streams
one row group at a time.)
"""

import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import comppo_core as cc
from comppo_core import arrow

rng = np.random.default_rng(0)

# ---- 1. a file of 8 responses (4 prompts × 2 samples) of 3 to 12 tokens
lengths = rng.integers(3, 13, size=8)
scores = np.array([1.0, -1.0, 1.0, 1.0, -1.0, 1.0, -1.0, -1.0])  # the verifier's outcome per response
rewards = [np.r_[np.zeros(n - 1), s].astype(np.float32) for n, s in zip(lengths, scores)]
table = pa.table(
    {
        "prompt_id": np.repeat(np.arange(4), 2),
        "rewards": pa.array(rewards, pa.list_(pa.float32())),
        "values": pa.array([rng.standard_normal(n).astype(np.float32) for n in lengths], pa.list_(pa.float32())),
        "concentration": pa.array([rng.random(n).astype(np.float32) for n in lengths], pa.list_(pa.float32())),
    }
)
with tempfile.TemporaryDirectory() as tmp:
    path = Path(tmp) / "rollouts.parquet"
    pq.write_table(table, path)
    table = pq.read_table(path)  # what a pipeline worker reads

# ---- 2. Comp-GAE on the Arrow table: gates from the concentration, z-scored per response
gate_params = cc.GateParams(low=0.5, high=1.0)  # the gate mapping, one value everywhere
out = arrow.compute_advantages(
    table, gamma=1.0, lam=0.95, lam_critic=1.0, concentration_col="concentration", gate_params=gate_params
)
print("columns:", out.column_names)
print("response 0 advantages:", np.round(out["advantages"][0].values.to_numpy(), 3))

# ---- 3. the same on NumPy: the flat values are the packed layout, the offsets cu_seqlens
cu = table["rewards"].combine_chunks().offsets.to_numpy()
flat = {name: table[name].combine_chunks().values.to_numpy() for name in ("rewards", "values", "concentration")}
gates = cc.gates_from_concentration(flat["concentration"], cu_seqlens=cu, params=gate_params)
adv, ret = cc.gae(flat["rewards"], flat["values"], cu_seqlens=cu, gates=gates, gamma=1.0, lam=0.95, lam_critic=1.0)
assert np.array_equal(adv, out["advantages"].combine_chunks().values.to_numpy())

# ---- 4. no critic: GRPO advantages per response, then on every token of it
grpo = cc.group_advantages(scores, table["prompt_id"].to_numpy(), method="grpo")
per_token = cc.broadcast(grpo, cu_seqlens=cu)
print("GRPO per response:", np.round(grpo, 3))
print(
    "credit over",
    len(per_token),
    "tokens:",
    {k: round(v, 3) for k, v in cc.credit_stats(per_token, cu_seqlens=cu).items()},
)
