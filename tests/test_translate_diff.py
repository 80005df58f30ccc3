"""Field-level plan diffs between two renderings."""

from __future__ import annotations

from control_plane.translate.diff import diff_renderings, format_changes, summarize

OLD = {
    "clusters": {
        "shop.critical": {
            "name": "shop.critical",
            "circuit_breakers": {"thresholds": [{"max_pending_requests": 2000}]},
        },
        "shop.legacy": {"name": "shop.legacy"},
    },
    "endpoints": {"shop.critical": {"weights": [95, 5]}},
}
NEW = {
    "clusters": {
        "shop.critical": {
            "name": "shop.critical",
            "circuit_breakers": {"thresholds": [{"max_pending_requests": 1500}]},
            "connect_timeout": "0.3s",
        },
        "shop.bulk": {"name": "shop.bulk"},
    },
    "endpoints": {"shop.critical": {"weights": [95, 5]}},
}


def test_add_change_remove_with_field_paths() -> None:
    changes = diff_renderings(OLD, NEW)
    assert [(c.kind, c.name, c.action) for c in changes] == [
        ("clusters", "shop.bulk", "add"),
        ("clusters", "shop.critical", "change"),
        ("clusters", "shop.legacy", "remove"),
    ]
    fields = [str(f) for f in changes[1].fields]
    assert fields == [
        "circuit_breakers.thresholds[0].max_pending_requests: 2000 -> 1500",
        "connect_timeout: + '0.3s'",
    ]
    assert summarize(changes) == "1 to add, 1 to change, 1 to remove"
    assert format_changes(changes)[0] == "  + clusters shop.bulk"


def test_identical_renderings_have_no_changes() -> None:
    assert diff_renderings(OLD, OLD) == []
    assert summarize([]) == "0 to add, 0 to change, 0 to remove"


def test_lists_of_different_length_are_one_change() -> None:
    changes = diff_renderings({"x": {"a": {"l": [1, 2]}}}, {"x": {"a": {"l": [1, 2, 3]}}})
    assert [str(f) for f in changes[0].fields] == ["l: [1, 2] -> [1, 2, 3]"]
