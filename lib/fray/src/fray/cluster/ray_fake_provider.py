"""Ray's fake multi-node provider, for node types that declare ``memory`` as a cloud's node types do.

Ray's autoscaler starts a node only of a type whose declared resources hold a pending request, and
fray asks for ``memory`` with every request (``ResourceConfig.ram``), as ``infra/``'s node types
declare it. Ray's own fake provider, which starts each "machine" as Ray processes of this host,
refuses a node type that declares ``memory``; this one starts such a node without it, so the node
reports the memory Ray finds on this machine, and everything else is Ray's. The monitor process
imports it by name (``provider: {type: external, module: ...}``); see
:class:`fray.cluster.ray_nodes.FakeAutoscaler`.
"""

from __future__ import annotations

from typing import Any

from ray.autoscaler._private.fake_multi_node.node_provider import FakeMultiNodeProvider


class FakeNodesDeclaringMemory(FakeMultiNodeProvider):
    def create_node_with_resources_and_labels(self, node_config: dict[str, Any], tags: dict[str, str], count: int,
                                              resources: dict[str, Any], labels: dict[str, str]) -> Any:
        without_memory = {name: amount for name, amount in resources.items() if name != "memory"}
        return super().create_node_with_resources_and_labels(node_config, tags, count, without_memory, labels)
