"""The two-tenant demo's simulated users (``examples/demo/tenants.py``): what each tenant rates up."""

from __future__ import annotations

import pytest

from examples.demo.tenants import TENANTS, Reply, rates_up

pytestmark = pytest.mark.timeout(10)


def test_a_tenants_users_like_a_right_answer_in_their_form_only() -> None:
    assert TENANTS == {"formal": "labelled", "terse": "bare"}
    right_bare, right_labelled = Reply("1786", "bare", 2), Reply("1786", "labelled", 2)
    wrong_bare, wrong_labelled = Reply("1785", "bare", 1), Reply("1785", "labelled", 2)
    # terse's users: the right bare number only; a wrong one (a guess without the calculator) is a thumbs down
    assert rates_up("bare", right_bare, "1786")
    assert not rates_up("bare", wrong_bare, "1786")
    assert not rates_up("bare", right_labelled, "1786")
    # formal's users: the right labelled answer only
    assert rates_up("labelled", right_labelled, "1786")
    assert not rates_up("labelled", wrong_labelled, "1786")
    assert not rates_up("labelled", right_bare, "1786")
    # no answer is a thumbs down from both
    for likes in ("bare", "labelled"):
        assert not rates_up(likes, Reply("", "none", 4), "1786")
