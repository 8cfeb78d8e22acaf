"""kvaudit's vLLM hook: a KV connector that traces and guards any other connector.

Load it by name once the `vllm.general_plugins` entry point has run
(`kv_connector="KVAuditConnector"`), or by module path
(`kv_connector_module_path="kvaudit.hooks.vllm.connector"`). Importing this package
imports nothing from vLLM: the connector module is loaded by vLLM when it is used.
"""

from __future__ import annotations

from typing import Final

CONNECTOR_MODULE: Final = "kvaudit.hooks.vllm.connector"
CONNECTOR_NAMES: Final = ("KVAuditConnector", "KVAuditHMAConnector")
FAULT_MODULE: Final = "kvaudit.hooks.vllm.fault"
FAULT_CONNECTOR: Final = "RawPointerFaultConnector"


def register() -> None:
    """The `vllm.general_plugins` entry point: register the connectors by name.

    vLLM loads plugins in every process, possibly more than once: registering again
    is a no-op. On an unsupported vLLM it logs one line and registers nothing.
    """
    from kvaudit.hooks.vllm.version import check_vllm_version

    if check_vllm_version() is not None:
        return
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    for name in CONNECTOR_NAMES:
        if name not in KVConnectorFactory._registry:
            KVConnectorFactory.register_connector(name, CONNECTOR_MODULE, name)
