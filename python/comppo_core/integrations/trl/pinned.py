"""The ``GRPOTrainer`` internals :class:`~comppo_core.integrations.trl.CompPOTrainer` relies on,
as trl 1.16 defines them. TRL rewrites its private methods often: a test compares these
with the installed trl, so an upgrade that changes one fails loudly (pyproject pins
``trl>=1.16,<1.17``)."""

from __future__ import annotations

__all__ = ["PINNED_ATTRIBUTES", "PINNED_SIGNATURES"]

#: ``str(inspect.signature(GRPOTrainer.<name>))`` in trl 1.16, for every method overridden or called.
PINNED_SIGNATURES: dict[str, str] = {
    "_generate_and_score_completions": (
        "(self, inputs: list[dict[str, torch.Tensor | typing.Any]]) -> dict[str, torch.Tensor | typing.Any]"
    ),
    "_calculate_rewards": "(self, inputs, prompts, completions, completion_ids_list)",
    "_prepare_inputs": (
        "(self, generation_batch: dict[str, torch.Tensor | typing.Any]) -> dict[str, torch.Tensor | typing.Any]"
    ),
    "_compute_loss": "(self, model, inputs)",
    "_save_checkpoint": "(self, model, trial)",
    "_load_optimizer_and_scheduler": "(self, checkpoint)",
    "training_step": "(self, model, inputs, num_items_in_batch)",
    "_get_output_dir": "(self, trial: 'optuna.Trial | dict[str, Any] | None') -> str",
    # transformers' Trainer's, which the critic warm-up calls for a sampler of its own
    "_get_dataloader": (
        "(self, dataset: torch.utils.data.dataset.Dataset, description: str, batch_size: int, sampler_fn: "
        "collections.abc.Callable[[torch.utils.data.dataset.Dataset], torch.utils.data.sampler.Sampler] | None = None, "
        "is_training: bool = False, dataloader_key: str | None = None) -> torch.utils.data.dataloader.DataLoader"
    ),
}

#: Attributes of a constructed ``GRPOTrainer`` that the subclass reads or sets.
PINNED_ATTRIBUTES: tuple[str, ...] = (
    "_buffered_inputs",
    "_metrics",
    "beta",
    "num_generations",
    "ref_model",
    "reward_weights",
    "current_gradient_accumulation_steps",
    "_logs",
    "_train_batch_size",
    "shuffle_dataset",
)
