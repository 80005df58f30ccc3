"""Pure translation: (desired state, PoP, node capabilities, what the running intent holds for
the PoP: `PopIntent`) -> Envoy resources.

`translate_pop` is the entry point; `render_json` and `static_bootstrap` present its output to
operators and to `envoy --mode validate`.
"""

from control_plane.translate.capabilities import ENVOY_RELEASES, capabilities_from_node
from control_plane.translate.pop import PopIntent, UnknownPop, translate_pop
from control_plane.translate.render import render_json
from control_plane.translate.static_bootstrap import static_bootstrap
from control_plane.translate.weights import WeightsError

__all__ = [
    "ENVOY_RELEASES",
    "PopIntent",
    "UnknownPop",
    "WeightsError",
    "capabilities_from_node",
    "render_json",
    "static_bootstrap",
    "translate_pop",
]
