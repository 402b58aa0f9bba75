"""A node tagged do-not-delegate stays out of XNNPACK; the tag says why, and which rule set it.

``node.meta[DO_NOT_DELEGATE]`` holds a string saying why the node must stay out. A user may write it
on any node (in a transform pass, or on the edge program before ``to_backend``) to keep that node out
for a reason of their own. xnnguard's own passes also record which rule set the tag, so a report says
"high_rank" or "conv3d" for them and "user_tag" only for the user's.

Every tag is mirrored into ``node.meta["custom"]``: ``torch.export`` and ``to_edge`` carry that dict
over to the nodes they retrace, while they drop other meta keys and renumber node names, so a tag set
before ``rewrite_for_xnnpack`` re-exports survives to the partitioner.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from xnnguard.report import Rule
from xnnguard.rules.rule import RuleCheck, Scope

if TYPE_CHECKING:
    import torch

__all__ = [
    "DO_NOT_DELEGATE",
    "DO_NOT_DELEGATE_RULE",
    "RULE",
    "tag",
    "tag_of",
    "tagged_rule",
    "tagged_violation",
    "untagged_meta",
]

DO_NOT_DELEGATE = "xnnguard_do_not_delegate"
DO_NOT_DELEGATE_RULE = "xnnguard_do_not_delegate_rule"  # the Rule value of a tag xnnguard set
_CUSTOM = "custom"  # the meta dict torch.export and to_edge carry over when they retrace a node


def _read(node: torch.fx.Node, key: str) -> str | None:
    return node.meta.get(key) or (node.meta.get(_CUSTOM) or {}).get(key) or None


def tag(node: torch.fx.Node, reason: str, rule: Rule = Rule.USER_TAG) -> None:
    """Tag ``node`` do-not-delegate with ``reason`` (set by ``rule``), unless it has a tag already.

    A tag is never overwritten: a user's reason is kept, and tagging twice changes nothing.
    """
    if tag_of(node):
        reason, found = str(tag_of(node)), _read(node, DO_NOT_DELEGATE_RULE)
        rule = Rule(found) if found else Rule.USER_TAG
    custom = node.meta.setdefault(_CUSTOM, {})
    node.meta[DO_NOT_DELEGATE] = custom[DO_NOT_DELEGATE] = reason
    if rule is not Rule.USER_TAG:
        node.meta[DO_NOT_DELEGATE_RULE] = custom[DO_NOT_DELEGATE_RULE] = rule.value


def untagged_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """A copy of a node's ``meta`` without a do-not-delegate tag: for a node a rewrite makes in the place
    of a tagged one, which the tag's reason does not apply to."""
    keys = (DO_NOT_DELEGATE, DO_NOT_DELEGATE_RULE)
    copied = {key: value for key, value in meta.items() if key not in keys}
    if isinstance(copied.get(_CUSTOM), dict):
        copied[_CUSTOM] = {key: value for key, value in copied[_CUSTOM].items() if key not in keys}
    return copied


def tag_of(node: torch.fx.Node) -> str | None:
    """The do-not-delegate reason of ``node`` (set directly, or carried over a re-export), or None."""
    return _read(node, DO_NOT_DELEGATE)


def tagged_rule(node: torch.fx.Node) -> Rule | None:
    """The rule that tagged ``node`` (``Rule.USER_TAG`` for a tag xnnguard did not set), or None if untagged."""
    if not tag_of(node):
        return None
    found = _read(node, DO_NOT_DELEGATE_RULE)
    return Rule(found) if found else Rule.USER_TAG


def tagged_violation(node: torch.fx.Node) -> str | None:
    """The reason a tag gives (a user's is marked as theirs), or None for an untagged node."""
    reason, rule = tag_of(node), tagged_rule(node)
    if not reason or rule is None:
        return None
    return reason if rule is not Rule.USER_TAG else f"tagged by user: {reason}"


RULE = RuleCheck(
    Rule.USER_TAG,
    Scope.NODE,
    "a node tagged do-not-delegate stays out; the record names the rule that set the tag",
    lambda node, _context: tagged_violation(node),
    rule_of=lambda node: tagged_rule(node) or Rule.USER_TAG,
)
