#!/usr/bin/env bash
# CompPO on verl 0.9.1 (the recipe: comppo_core.integrations.verl), one node of GPUs, vLLM rollouts.
#
#   pip install "comppo-core[verl]" "verl[vllm]==0.9.1"     # verl's v1 trainer needs verl[verl-core]
#   python examples/data_preprocess/gsm8k.py --local_save_dir ~/data/gsm8k   # in a verl checkout; or your parquet
#   ARM=comppo MODEL=Qwen/Qwen3-0.6B bash examples/verl/run_comppo.sh [more hydra overrides]
#
# ARM is one of: grpo ppo ppo_fixed comp_gae tac_fixed comppo comppo_shuffle comppo_position comppo_inverted
# (comppo.arm decides algorithm.adv_estimator and critic.enable; contradicting them is an error).
# Every other setting is verl's own (python -m verl.trainer.main_ppo --help), plus the comppo block
# (comppo_core/integrations/verl/conf/comppo_trainer.yaml, docs/verl.md).
set -euo pipefail

ARM=${ARM:-comppo}
MODEL=${MODEL:-Qwen/Qwen3-0.6B}
DATA=${DATA:-$HOME/data/gsm8k}
GPUS=${GPUS:-$(nvidia-smi -L | wc -l)}

python -m comppo_core.integrations.verl.main_ppo \
    comppo.arm="$ARM" \
    comppo.tac.width=256 \
    comppo.tac.temporal=none \
    comppo.vf_coef=0.5 \
    data.train_files="$DATA/train.parquet" \
    data.val_files="$DATA/test.parquet" \
    data.train_batch_size=256 \
    data.max_prompt_length=512 \
    data.max_response_length=512 \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.model.use_remove_padding=true \
    actor_rollout_ref.actor.strategy=fsdp2 \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.5 \
    critic.model.path="$MODEL" \
    critic.optim.lr=1e-5 \
    critic.ppo_micro_batch_size_per_gpu=8 \
    trainer.n_gpus_per_node="$GPUS" \
    trainer.nnodes=1 \
    trainer.total_epochs=1 \
    trainer.logger='[console]' \
    trainer.project_name=comppo \
    trainer.experiment_name="verl-$ARM" \
    "$@"
