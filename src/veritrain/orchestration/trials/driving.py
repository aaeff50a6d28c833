"""What the sweep and search drivers share around their own loop: the smoke test of the base config first, a new
set opened (its folder, spec.json, the code copied, the backend, the lock its driver holds), and a resumed one's
settings, with a damaged plan refused in one line."""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, cast

from veritrain.core.config import ResolvedConfig
from veritrain.core.errors import UserError
from veritrain.core.files import write_atomic
from veritrain.orchestration import smoke as smoke_module
from veritrain.orchestration.trials import state
from veritrain.orchestration.trials.backends import TrialBackend, open_backend
from veritrain.orchestration.trials.planning import require_ray
from veritrain.orchestration.trials.state import Kind
from veritrain.records.record import now_iso
from veritrain.records.workspace import Workspace


def smoke_first(base: ResolvedConfig, workspace: Workspace, argv: list[str], smoke: bool, skipped_because: Optional[str] = None) -> dict[str, Any]:
    """The smoke test of the base config, before any trial (fails fast, exit 1), as spec.json records it: skipped
    with --no-smoke, or `skipped_because` something stands in for it."""
    from veritrain.orchestration.pipeline import refuse_to_start

    refuse_to_start(argv)  # spec.json keeps the command line as given
    if skipped_because:
        return {"status": "skipped", "reason": skipped_because}
    if not smoke:
        return {"status": "skipped"}
    passed = smoke_module.ensure(base, workspace)
    return {"key": passed["key"], "status": passed["status"], "cached": passed["cached"]}


@contextmanager
def opened(kind: Kind, workspace: Workspace, argv: list[str], smoke_result: dict[str, Any], plan: dict[str, Any], backend: str,
           parallel: int, ray_address: Optional[str], record_code: Callable[[Path], dict[str, Any]]) -> Iterator[tuple[dict[str, Any], Path, TrialBackend]]:
    """A new set: its folder, the code its configs name copied there, its backend, then spec.json (the plan with
    the code's listing), all under the lock its driver holds. Nothing is left behind when the code or the backend
    cannot be had (exit 2): there is nothing to resume."""
    set_id, folder = state.new_folder(workspace, kind)
    with state.driving(workspace, kind, set_id, ""):
        spec = {kind.version_key: kind.version, "id": set_id, "created_at": now_iso(), "argv": argv, "workspace": str(workspace.root),
                "smoke": smoke_result, **plan}
        try:
            spec["code"] = record_code(folder)
            trials = open_backend(backend, spec, folder, parallel, ray_address)
        except UserError:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        write_atomic(folder / "spec.json", state.json_bytes(spec))
        yield spec, folder, trials


def resumed_backend(spec: dict[str, Any], folder: Path, ref: str, parallel: Optional[int], backend: Optional[str],
                    ray_address: Optional[str]) -> tuple[TrialBackend, int]:
    """The backend a resumed set runs on (its own, unless --backend) and how many trials at once (its own, unless
    --parallel)."""
    name = cast(str, backend or spec["backend"])
    if name == "ray":
        require_ray()
    parallel = parallel or spec["parallel"]
    if not isinstance(parallel, int) or isinstance(parallel, bool) or parallel < 1:
        raise UserError(f"--resume {ref}: spec.json says parallel {str(parallel)[:20]}; give --parallel K (K ≥ 1)")
    return open_backend(name, spec, folder, parallel, ray_address), parallel


@contextmanager
def malformed_is_user_error(kind: Kind, folder: Path, ref: str) -> Iterator[None]:
    """A hand-edited or damaged spec.json met while resuming: one line (exit 2), never a traceback."""
    try:
        yield
    except (KeyError, TypeError, AttributeError, IndexError) as err:
        raise UserError(f"--resume {ref}: {folder / 'spec.json'} is malformed ({err.__class__.__name__}: {str(err)[:80]}); "
                        f"start a new {kind.name}") from None
