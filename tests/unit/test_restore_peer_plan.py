"""Which steps the peer tier makes restorable: the newest step every writer can
get from its holder or the global tier, never one some writer lacks."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ckptdrain.restore.peer_plan import peer_steps


def test_the_newest_step_every_writer_can_get_wins() -> None:
    held = {0: [30, 20], 1: [30, 20], 2: [20, 10]}
    assert peer_steps(3, held, global_steps=[10]) == [20]


def test_a_writer_may_get_a_step_from_the_global_tier_instead() -> None:
    # Writer 2's holder has only 10, but step 15 is global... only if 15 is complete
    # globally, which then is the existing plan's; 25 needs every writer's holder.
    held = {0: [25], 1: [25], 2: []}
    assert peer_steps(3, held, global_steps=[10]) == []
    assert peer_steps(3, {0: [25], 1: [25], 2: [25]}, global_steps=[10]) == [25]


def test_steps_complete_globally_are_left_to_the_global_plan() -> None:
    assert peer_steps(2, {0: [10, 20], 1: [10, 20]}, global_steps=[10]) == [20]


def test_a_writer_whose_holder_could_not_be_asked_holds_nothing() -> None:
    assert peer_steps(2, {0: [20]}, global_steps=[]) == []


@given(st.integers(1, 5), st.data())
def test_every_chosen_step_is_available_to_every_writer(writers: int, data: st.DataObject
                                                        ) -> None:
    steps = st.lists(st.integers(0, 8), max_size=5)
    held = {w: data.draw(steps) for w in range(writers)}
    complete = data.draw(steps)
    chosen = peer_steps(writers, held, complete)
    assert chosen == sorted(set(chosen), reverse=True)
    for step in chosen:
        assert step not in complete
        assert all(step in held[w] or step in complete for w in range(writers))
