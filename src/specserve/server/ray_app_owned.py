"""The app's own Ray actors (the metrics hub, the Responses and chat stores) end with the app.

They are detached, so a replica that dies or is replaced does not take the responses and metrics
of the others with it; but a detached actor outlives whatever created it, and `serve shutdown`
(or a config that drops the app) removed the app and left them running for as long as the
cluster did, the store holding up to 64 MB of responses. `specserve serve --ray` kills them
itself on its way out; any other way of stopping the app relied on nobody.

So each of them watches its app: once Serve has had no deployment of the app for APP_GONE_CHECKS
checks in a row (APP_CHECK_S apart), the actor kills itself. A redeploy keeps the app's
deployments, and a Serve controller that is restarting answers nothing (not "gone"), so
neither ends them.
"""

from __future__ import annotations

import threading
import time

APP_CHECK_S = 2.0
APP_GONE_CHECKS = 2
CALL_TIMEOUT_S = 15.0


def app_exists(app_name: str) -> bool | None:
    """Whether Serve has a deployment of the app; None when the controller could not say."""
    import ray
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    try:
        controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    except ValueError:  # no controller: Serve was shut down
        return False
    except Exception:  # noqa: BLE001 - the cluster is unreachable: unknown
        return None
    try:
        ids = ray.get(controller.list_deployment_ids.remote(), timeout=CALL_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - restarting, or busy: unknown
        return None
    return any(d.app_name == app_name for d in ids)


def end_with_app(app_name: str) -> None:
    """Called in the actor's __init__: watch the app from a thread and kill this actor once the
    app is gone (nothing outside a Ray actor)."""
    import ray

    if not ray.is_initialized() or ray.get_runtime_context().get_actor_id() is None:
        return
    me = ray.get_runtime_context().current_actor
    threading.Thread(target=_watch, args=(app_name, me), name="specserve-app-watch", daemon=True).start()


def _watch(app_name: str, me) -> None:
    """Poll the app's existence; ray.kill this actor after APP_GONE_CHECKS answers of "gone"."""
    import ray

    gone = 0
    while gone < APP_GONE_CHECKS:
        time.sleep(APP_CHECK_S)
        gone = gone + 1 if app_exists(app_name) is False else 0
    ray.kill(me)
