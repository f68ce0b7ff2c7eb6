"""The pod views goodput accounting (goodput.py) folds: a writer's pod
interrupted at a step, and the pod that restored after it."""

from __future__ import annotations

from ckptdrain.contract.goodput import AgentView, PodView, RestoreView

T0 = 1_700_000_000.0


def interrupted(pod: str, writer: str, at: float, step: int, completed: dict[int, float],
                blocked: float = 0.0, step_s: float | None = 0.5,
                bound: float | None = T0) -> PodView:
    return PodView(pod, writer, agent=AgentView(
        training_at=T0, first_step=0, blocked_s=blocked, interrupted_at=at, step=step,
        step_s=step_s, completed=tuple(sorted(completed.items())), newest_local=step,
        newest_global=None), bound_at=bound)


def restarted(pod: str, writer: str, started: float, seconds: float, step: int | None,
              tier: str | None, training: float | None, outcome: str = "restored",
              reason: str = "", bound: float | None = None) -> PodView:
    agent = None if training is None else AgentView(training_at=training, first_step=0)
    return PodView(pod, writer, agent=agent, restore=RestoreView(
        outcome=outcome, started_at=started, seconds=seconds, step=step, tier=tier,
        reason=reason), bound_at=bound)
