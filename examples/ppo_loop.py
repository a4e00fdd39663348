"""One PPO iteration with CompPO's advantages, on a tiny random policy (CPU, seconds).

Where comppo-core enters a PPO loop you already have:

1. sample responses and score them (your rollout code; a toy verifier here);
2. the scoring forward pass, with the probe: log-probs and attention concentration,
   aligned column for column (``hf.score``, the same forward the update runs with
   gradients);
3. gates from the concentration, then Comp-GAE advantages and the critic's λ-returns
   (``cc.gates_from_concentration``, ``cc.gae``), or verl's function as a drop-in;
4. the PPO update, unchanged.

Needs the [hf] extra (torch, transformers):  python examples/ppo_loop.py
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM, LlamaModel

import comppo_core as cc
from comppo_core import hf
from comppo_core.integrations import verl as cc_verl

torch.manual_seed(0)
PAD, EOS, VOCAB = 0, 1, 32
config = LlamaConfig(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    pad_token_id=PAD,
    eos_token_id=EOS,
    bos_token_id=2,
)
policy = LlamaForCausalLM(config)
critic = LlamaModel(config)  # the standard critic: a second transformer
value_head = torch.nn.Linear(config.hidden_size, 1)  # with a value head
optimizer = torch.optim.AdamW([*policy.parameters(), *critic.parameters(), *value_head.parameters()], lr=1e-4)

# ---- 1. rollout: left-padded prompts, sampled responses, one score per response
prompts = torch.randint(3, VOCAB, (4, 6))
prompt_mask = torch.ones_like(prompts)
prompt_mask[1, :2] = prompt_mask[3, :3] = 0  # shorter prompts, padded on the left
prompts = prompts.masked_fill(prompt_mask == 0, PAD)
with torch.no_grad():
    ids = policy.generate(
        input_ids=prompts,
        attention_mask=prompt_mask,
        do_sample=True,
        max_new_tokens=10,
        pad_token_id=PAD,
        eos_token_id=EOS,
    )
response = ids[:, prompts.shape[1] :]
is_eos = response == EOS
in_response = (is_eos.cumsum(1) - is_eos.long()) == 0  # up to and including the first EOS
attention_mask = torch.cat([prompt_mask, in_response.long()], dim=1)
scores = torch.tensor([1.0 if (r[m] == 7).any() else -1.0 for r, m in zip(response, in_response)])

# ---- 2. scoring pass: [B, T-1] columns, column j scores token ids[:, j+1] from position j
scored = hf.score(policy, ids, attention_mask, concentration=True)  # no grad by default
old_logprobs, conc = scored.logprobs, scored.concentration
position_ids = hf.default_position_ids(attention_mask)


def critic_values() -> torch.Tensor:
    """V per column: values[:, j] is the value of the prefix ids[:, :j+1]."""
    hidden = critic(input_ids=ids, attention_mask=attention_mask, position_ids=position_ids).last_hidden_state
    return value_head(hidden).squeeze(-1)[:, :-1]


with torch.no_grad():
    values = critic_values()
cols = torch.zeros_like(attention_mask[:, 1:], dtype=torch.bool)  # the response columns
cols[:, prompts.shape[1] - 1 :] = in_response
last = (cols * torch.arange(cols.shape[1])).argmax(dim=1)  # each row's last response column
rewards = torch.zeros_like(values)
rewards[torch.arange(len(scores)), last] = scores  # the outcome on the last token

# ---- 3. CompPO's advantages: gates from the concentration, then Comp-GAE
gates = cc.gates_from_concentration(conc, mask=cols, params=cc.GateParams(low=0.5, high=1.0))
adv, returns = cc.gae(rewards, values, mask=cols, gates=gates, gamma=1.0, lam=0.95, lam_critic=1.0)
adv = cc.masked_whiten(adv, mask=cols)  # as verl does for the actor
print("credit:", {k: round(v, 3) for k, v in cc.credit_stats(adv, mask=cols).items()})

# the same advantages with verl's exact semantics (whitened; its returns use λ, not λ_critic)
adv_verl, _ = cc_verl.compute_gae_advantage_return(rewards, values, cols.float(), 1.0, 0.95, gates=gates)
assert torch.allclose(adv_verl[cols], adv[cols], atol=1e-5)

# ---- 4. the PPO update (clipped policy loss, squared value loss), two epochs
n = cols.sum()
for epoch in range(2):
    logprobs = hf.score(policy, ids, attention_mask, grad=True).logprobs  # the same columns, with gradients
    ratio = torch.exp(logprobs - old_logprobs)
    policy_loss = -(torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv) * cols).sum() / n
    value_loss = ((critic_values() - returns) ** 2 * cols).sum() / n
    (policy_loss + 0.5 * value_loss).backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"epoch {epoch}: policy loss {policy_loss.item():+.4f}, value loss {value_loss.item():.4f}")
