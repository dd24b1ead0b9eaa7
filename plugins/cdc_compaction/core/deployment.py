"""Which Airflow deployment a run belongs to, and the check that no two deployments share a name.

A table's lease is held by ``<deployment id>/<run id>``. Two deployments share run ids
(``scheduled__2026-…``), so two deployments with one deployment id would both hold the
same lease and compact one table at once. Hence:

* **Unique by default.** Each Airflow deployment has an *instance* token: a random value
  created once in its own metadata database, as the Airflow Variable
  ``cdc_compaction_deployment_id`` (get-or-create through the Task SDK's ``Variable`` API;
  tasks in Airflow 3 reach the database only through the Execution API). Every worker
  process of one deployment reads the same Variable, so they agree; another deployment
  has another metadata database, so another token, even with the very same
  ``sql_alchemy_conn`` URL (the stock docker-compose one, or the default SQLite path).
  Without ``CDC_DEPLOYMENT_ID`` the deployment id is ``airflow-<token>``.
* **A shared id is refused.** ``CDC_DEPLOYMENT_ID`` names the deployment explicitly.
  The first time a deployment takes a table's lease it registers itself in that table's
  lake as ``_cdc/deployments/<id>.json`` with its instance token (create-if-absent); a
  deployment whose token differs from the registered one is refused with
  :class:`~cdc_compaction.core.exceptions.DeploymentConflictError`, which names both.
* **Outside Airflow** (``cdc-compaction step``, the tests' in-process runs)
  there are no Variables: the id is ``CDC_DEPLOYMENT_ID`` or ``local-<hash of the host
  name>``, and nothing is registered or checked (the command acts for whichever
  deployment it names).

The token is created once per deployment, by the first task that needs it. Two workers
doing that at the very same moment could each write their own; both read the Variable
again after a pause and use what it holds then, so they end up agreeing. A run's later
tasks use the lease owner recorded in its plan, never the id again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import posixpath
import re
import secrets
import socket
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from cdc_compaction.core.exceptions import DeploymentConflictError, PreconditionFailedError

if TYPE_CHECKING:
    from cdc_compaction.core.lake import Lake

log = logging.getLogger(__name__)

ENV = "CDC_DEPLOYMENT_ID"
#: The Airflow Variable holding this deployment's instance token (created once per metadata DB).
VARIABLE = "cdc_compaction_deployment_id"
#: After creating the token, how long to wait before reading back what the Variable holds.
CREATE_SETTLE_SECONDS = 1.0
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,100}$")


@dataclass(frozen=True)
class Identity:
    """This process's deployment: the id leases name, and the instance token behind it."""

    deployment_id: str
    #: The random token in this deployment's metadata DB; None outside an Airflow task (nothing to check).
    instance: str | None
    #: Where the id came from: ``CDC_DEPLOYMENT_ID``, the Airflow Variable, or the host (outside Airflow).
    source: str


def in_airflow_task() -> bool:
    """True inside an Airflow task process (the Task SDK's supervisor channel is set up).

    Looked up, never imported: importing the task runner configures Airflow's logging, which
    would change what the command line prints.
    """
    task_runner = sys.modules.get("airflow.sdk.execution_time.task_runner")
    return task_runner is not None and getattr(task_runner, "SUPERVISOR_COMMS", None) is not None


def _instance_token() -> str:
    """This deployment's token from its metadata DB: the Variable, created on first use."""
    from airflow.sdk import Variable

    value = Variable.get(VARIABLE, default=None)
    if value and str(value).strip():
        return str(value).strip()
    token = secrets.token_hex(8)
    Variable.set(
        VARIABLE,
        token,
        description="cdc-compaction: this Airflow deployment's identity in table leases. Never copy it "
        "to another deployment; deleting it gives the deployment a new identity.",
    )
    log.info("created the Airflow Variable %s: this deployment's instance token is %s", VARIABLE, token)
    # A worker that raced us may have written its own token: after a pause, every racer reads
    # the Variable's final value, so all processes of the deployment agree.
    time.sleep(CREATE_SETTLE_SECONDS)
    value = Variable.get(VARIABLE, default=None)
    return str(value).strip() if value and str(value).strip() else token


@functools.cache
def identity() -> Identity:
    """This process's deployment identity (see the module docstring); computed once per process."""
    explicit = os.environ.get(ENV, "").strip()
    instance = _instance_token() if in_airflow_task() else None
    if explicit:
        return Identity(explicit, instance, ENV)
    if instance is not None:
        return Identity(f"airflow-{instance}", instance, f"Airflow Variable {VARIABLE}")
    host = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:10]
    return Identity(f"local-{host}", None, "host name (outside Airflow)")


def deployment_id() -> str:
    """The deployment id that table leases name (``<deployment id>/<run id>``)."""
    return identity().deployment_id


def registration_path(lake: Lake, deployment: str) -> str:
    """Where a deployment id is registered in a table's lake."""
    name = deployment if _SAFE_NAME.match(deployment) else "h-" + hashlib.sha256(deployment.encode()).hexdigest()[:16]
    return posixpath.join(lake.layout.control, "deployments", f"{name}.json")


def _describe_self() -> dict[str, Any]:
    """What tells a person which deployment this is (host, metadata DB without password, API)."""
    doc: dict[str, Any] = {"host": socket.gethostname()}
    try:
        from airflow.configuration import conf

        url = conf.get("database", "sql_alchemy_conn", fallback="") or ""
        if url:
            from sqlalchemy.engine import make_url

            doc["metadata_db"] = make_url(url).set(password=None).render_as_string(hide_password=False)
        api = conf.get("core", "execution_api_server_url", fallback="") or ""
        if api:
            doc["execution_api"] = api
    except Exception:  # descriptive only: a worker without a database address is fine
        log.debug("no Airflow configuration to describe this deployment with", exc_info=True)
    return doc


def register(lake: Lake, ident: Identity | None = None, now: datetime | None = None) -> bool:
    """Register this deployment in ``lake`` or check it against the registration; True if it registered now.

    Raises :class:`DeploymentConflictError` if the id is registered by a deployment with
    another instance token. Outside Airflow (no token) nothing is registered or checked.
    """
    ident = ident or identity()
    if ident.instance is None:
        return False
    path = registration_path(lake, ident.deployment_id)
    mine = {
        "deployment_id": ident.deployment_id,
        "instance": ident.instance,
        "source": ident.source,
        "registered_at": (now or datetime.now(UTC)).isoformat(),
        **_describe_self(),
    }
    try:
        lake.storage.create_exclusive(path, json.dumps(mine, indent=1, sort_keys=True))
        log.info("%s: deployment %s registered in %s", lake.cfg.qualified_name, ident.deployment_id, path)
        return True
    except PreconditionFailedError:
        pass  # registered before: by this deployment (the usual case) or by another one
    try:
        theirs = json.loads(lake.storage.read_text(path))
        registered = str(theirs["instance"])
    except (ValueError, TypeError, KeyError) as exc:
        raise DeploymentConflictError(
            f"{lake.cfg.qualified_name}: the registration {path} of deployment id {ident.deployment_id!r} is "
            f"unreadable ({exc!r}), so this deployment cannot tell whether another one uses the same id. This run "
            "changed nothing. If no other deployment uses it, delete the file; the next run registers again"
        ) from exc
    if registered == ident.instance:
        return False
    raise DeploymentConflictError(
        f"{lake.cfg.qualified_name}: deployment id {ident.deployment_id!r} (from {ident.source}) is already used "
        f"by another Airflow deployment: {_who(theirs, registered=True)}. This deployment is {_who(mine)}. "
        "Two deployments with one id would both hold the table's lease and compact it at the same time; "
        "this run changed nothing. "
        f"Give each deployment its own {ENV} (or unset it: the default, airflow-<token of the Airflow Variable "
        f"{VARIABLE}>, differs between metadata databases). If the other one is this deployment before its "
        f"metadata database was replaced and it no longer runs, delete {path}"
    )


def _who(doc: dict[str, Any], registered: bool = False) -> str:
    """One deployment as a person can find it: token, host, metadata DB (and when it registered)."""
    parts = [f"instance {doc.get('instance')}", f"host {doc.get('host', '?')}"]
    if doc.get("metadata_db"):
        parts.append(f"metadata DB {doc['metadata_db']}")
    if registered:
        parts.append(f"registered {doc.get('registered_at', '?')}")
    return ", ".join(parts)
