"""Gateway adapters, one module per gateway, looked up by the name in the URL."""

from __future__ import annotations

from types import ModuleType

from app.gateways import card, paymos, pg

ADAPTERS: dict[str, ModuleType] = {"pg": pg, "card": card, "paymos": paymos}
