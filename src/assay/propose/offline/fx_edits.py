"""The edits every fx rewrite of a traced forward ends with (:mod:`rewrites`,
:mod:`tensor_algebra`): a node replaced by the nodes written for it, the graph checked and its
code made again."""

from __future__ import annotations

from torch import fx


def replace_node(node: fx.Node, new: fx.Node, same_shape: bool = True) -> None:
    """Point ``node``'s users at ``new`` and erase ``node``. With ``same_shape`` ``new`` takes
    ``node``'s meta (its ``tensor_meta``), for a rewrite after which shapes are not propagated
    again."""
    if same_shape:
        new.meta = dict(node.meta)
    node.replace_all_uses_with(new)
    node.graph.erase_node(node)


def recompile(gm: fx.GraphModule) -> None:
    """``gm``'s graph checked (fx's lint) and its code made again after an edit."""
    gm.graph.lint()
    gm.recompile()
