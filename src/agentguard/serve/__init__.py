"""``agentguard serve``: an OpenAI-compatible guard in front of any upstream.

- ``_upstream``: the upstream as a model transport (httpx, pooled; bodies kept byte for byte);
- ``_app``: :class:`GuardServer` (what requests share), the route table :data:`ROUTES` and
  :func:`add_route`, and :func:`create_app` (the Starlette app, :class:`GuardApp`).

Needs the ``serve`` extra: ``pip install "agentguard[serve]"``.
"""

from __future__ import annotations

from ._app import ROUTES, Endpoint, GuardApp, GuardServer, add_route, create_app

__all__ = ["ROUTES", "Endpoint", "GuardApp", "GuardServer", "add_route", "create_app"]
