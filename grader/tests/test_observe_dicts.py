"""The observer carries a dict subclass (a module's ``state_dict()``, an ``OrderedDict``) as a
dict of the judge's own subclass: its items as they were, read without the subclass's methods,
and a type that is not ``dict`` (so ``type(v) is dict`` fails as it did in the kernel)."""

from __future__ import annotations

import collections


def test_dict_subclasses_arrive_as_observed_dicts():
    import torch

    from grader.observations import ObservedDict, decode
    from grader.observe import new_observer

    class Lying(dict):
        def items(self):
            return iter([("forged", 1)])

        def keys(self):
            return iter(["forged"])

    observer = new_observer("x", 1)
    state = torch.nn.Linear(2, 3).state_dict()
    observer.record("state", state)
    observer.record("nested", {"state_dict": collections.OrderedDict(w=torch.ones(2)), "n": 1})
    observer.record("lying", Lying(real=2.5))
    observer.record("plain", {"a": 1})
    observer.done()
    obs = decode(observer.bundle())

    got = obs.next("state")
    assert type(got) is ObservedDict and got.observed_type == "OrderedDict"
    assert obs.type_of() == "OrderedDict"
    assert isinstance(got, dict) and list(got) == list(state)
    assert all(torch.equal(got[k], v) for k, v in state.items())
    nested = obs.next("nested")
    assert type(nested) is dict and type(nested["state_dict"]) is ObservedDict
    assert torch.equal(nested["state_dict"]["w"], torch.ones(2)) and nested["n"] == 1
    lying = obs.next("lying")
    assert dict(lying) == {"real": 2.5} and lying.observed_type.endswith(".Lying")
    plain = obs.next("plain")
    assert type(plain) is dict and plain == {"a": 1} and obs.type_of() is None
    obs.finish()
