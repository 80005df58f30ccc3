"""YAML text to a node tree that remembers where every value was written.

PyYAML's composer (SafeLoader) gives nodes with start marks; this module adds the rules of our
format on top: one document, no anchors or aliases, only the standard tags, plain scalar keys,
no key written twice. Every violation becomes a problem; the tree is returned even when some
were found, so the schema can report its own problems in the same run.
"""

from __future__ import annotations

import yaml
from yaml._yaml import CParser
from yaml.composer import Composer
from yaml.resolver import Resolver

from control_plane.desired.errors import At, Sink

STANDARD_TAGS = frozenset(
    f"tag:yaml.org,2002:{name}" for name in ("str", "int", "float", "bool", "null", "map", "seq")
)
NUMBER_TAGS = frozenset({"tag:yaml.org,2002:int", "tag:yaml.org,2002:float"})
NULL_TAG = "tag:yaml.org,2002:null"
MAX_DEPTH = 32  # mappings and lists inside each other; the format needs 6
MAX_NUMBER_CHARS = 40  # of a number as written (Python refuses ints over 4,300 digits)
_CONSTRUCTOR = yaml.constructor.SafeConstructor()
LIBYAML_TOO_DEEP = "exceeded maximum nesting depth"  # its scanner's words, past 1,000 levels
_OPENS = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
_CLOSES = (yaml.MappingEndEvent, yaml.SequenceEndEvent)


class _Composer(Composer, CParser, Resolver):  # type: ignore[misc]
    """PyYAML's composer over LibYAML's scanner and parser (`CParser`, in PyYAML's wheels),
    refusing anchors, aliases, non-standard tags, nesting deeper than `MAX_DEPTH` and numbers
    longer than `MAX_NUMBER_CHARS` as it goes.

    The scanner decides what opens a collection by YAML's own tokenisation (`y: a:'b [` is a
    plain scalar, not a quote), so nothing has to guess at it before parsing. PyYAML's own
    Python scanner does work proportional to the flow depth for every token (6,000 levels: 16 s
    of CPU) and ten times LibYAML's per byte; LibYAML refuses flow nesting past 1,000 levels
    itself (reported like ours), and below that this composer refuses anything past
    `MAX_DEPTH`. The whole read is linear in the size (docs/security.md states the bound)."""

    def __init__(self, text: str, sink: Sink) -> None:
        CParser.__init__(self, text)
        Composer.__init__(self)
        Resolver.__init__(self)
        self.sink = sink
        self.depth = 0

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node:
        event = self.peek_event()
        at = At.mark(event.start_mark, "")
        if isinstance(event, _OPENS) and self.depth >= MAX_DEPTH:
            self.sink.add(at, f"nested more than {MAX_DEPTH} levels deep; the format needs "
                          "far fewer")
            self._skip_collection()
            return yaml.ScalarNode(NULL_TAG, "", event.start_mark, event.end_mark)
        self.depth += 1
        try:
            return self._compose_checked(parent, index, event, at)
        finally:
            self.depth -= 1

    def _skip_collection(self) -> None:
        """Consume one collection's events without building (or recursing into) it."""
        level = 0
        while True:
            event = self.get_event()
            if isinstance(event, _OPENS):
                level += 1
            elif isinstance(event, _CLOSES):
                level -= 1
            if level == 0:
                return

    def compose_scalar_node(self, anchor: str | None) -> yaml.ScalarNode:
        node: yaml.ScalarNode = super().compose_scalar_node(anchor)
        if node.tag in NUMBER_TAGS and len(node.value) > MAX_NUMBER_CHARS:
            self.sink.add(At.of(node, ""), f"a number of {len(node.value):,} characters; "
                          f"numbers here have at most {MAX_NUMBER_CHARS}")
            node.tag = NULL_TAG
        return node

    def _compose_checked(
        self, parent: yaml.Node | None, index: object, event: yaml.Event, at: At
    ) -> yaml.Node:
        if isinstance(event, yaml.AliasEvent):
            self.get_event()
            self.sink.add(at, f"aliases (*{event.anchor}) are not supported; write the value out")
            return yaml.ScalarNode("tag:yaml.org,2002:null", "", event.start_mark, event.end_mark)
        if event.anchor is not None:
            self.sink.add(at, f"anchors (&{event.anchor}) are not supported; write values out")
            event.anchor = None
        tag = getattr(event, "tag", None)
        if tag is not None and tag != "!" and tag not in STANDARD_TAGS:
            self.sink.add(at, f"tag {tag} is not supported; remove it")
            event.tag = None
        return super().compose_node(parent, index)


def compose(text: str, sink: Sink) -> yaml.Node | None:
    """The document's root node, or None (with a problem) when there is nothing usable."""
    try:
        root = _Composer(text, sink).get_single_node()
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        at = At.mark(mark, "") if mark else At(1, 1, "")
        if error.problem == LIBYAML_TOO_DEEP:
            sink.add(at, f"nested more than {MAX_DEPTH} levels deep; the format needs far fewer")
        else:
            sink.add(at, _syntax_message(error))
        return None
    except yaml.YAMLError as error:
        sink.add(At(1, 1, ""), f"YAML error: {error}")
        return None
    if root is None:
        sink.whole_file("the file is empty; expected a mapping with pops, origin_groups and "
                        "listeners")
        return None
    _check_keys(root, "", sink)
    return root


def _syntax_message(error: yaml.MarkedYAMLError) -> str:
    message = f"YAML syntax error: {error.problem or error.context}"
    if error.context and error.problem and error.context_mark is not None:
        message += f" ({error.context} at line {error.context_mark.line + 1})"
    return message


def _check_keys(node: yaml.Node, path: str, sink: Sink) -> None:
    if isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _check_keys(item, f"{path}[{index}]", sink)
    if not isinstance(node, yaml.MappingNode):
        return
    first_line: dict[str, int] = {}
    for key, value in node.value:
        if not isinstance(key, yaml.ScalarNode):
            sink.add(At.of(key, path), "keys must be plain names, not a mapping or list")
            continue
        if key.value in first_line:
            sink.add(At.of(key, path), f"duplicate key '{key.value}' "
                     f"(first at line {first_line[key.value]})")
        else:
            first_line[key.value] = key.start_mark.line + 1
        _check_keys(value, join(path, key.value), sink)


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def scalar(node: yaml.ScalarNode) -> object:
    """The Python value of a scalar under YAML 1.1 core rules (int, float, bool, None, str)."""
    kind = node.tag.rsplit(":", 1)[-1]
    if kind == "int":
        return _CONSTRUCTOR.construct_yaml_int(node)
    if kind == "float":
        return _CONSTRUCTOR.construct_yaml_float(node)
    if kind == "bool":
        return _CONSTRUCTOR.construct_yaml_bool(node)
    if kind == "null":
        return None
    return node.value


def plain_value(node: yaml.Node) -> object:
    """A node as plain Python values (dicts, lists, scalars), for typed JSON written in YAML."""
    if isinstance(node, yaml.MappingNode):
        return {str(key.value): plain_value(value) for key, value in node.value}
    if isinstance(node, yaml.SequenceNode):
        return [plain_value(item) for item in node.value]
    return scalar(node)  # type: ignore[arg-type]


def is_null(node: yaml.Node | None) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null")


def describe(node: yaml.Node) -> str:
    """How a node reads in a message: `'one'`, `12 (an integer)`, `a list`."""
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    kind = node.tag.rsplit(":", 1)[-1]
    return {
        "int": f"{node.value} (an integer)",
        "float": f"{node.value} (a number)",
        "bool": f"{node.value} (a boolean)",
        "null": "nothing (null)",
    }.get(kind, repr(node.value))
