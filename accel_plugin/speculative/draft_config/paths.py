"""Where a ``draft`` path of the YAML points: ``~`` expanded, a relative path taken
relative to the YAML file's folder (not the server's working directory), resolved
once (symlinks, ``..``) into the absolute path that is loaded and logged, and the
directory checked as a draft model (:func:`accel_plugin.models.dirs.check_draft_dir`)."""

from __future__ import annotations

from pathlib import Path

from ...models.dirs import ModelDirError, check_draft_dir

__all__ = ["resolve_draft_dir"]


def resolve_draft_dir(raw: str, base: Path, trust_remote_code: bool) -> tuple[Path | None, str | None]:
    """``raw`` as a draft directory: ``~`` expanded, relative to ``base``, resolved
    (symlinks, ``..``) once. Returns (path, None) or (None, problem)."""
    try:
        given = Path(raw).expanduser()
        lexical = given if given.is_absolute() else base / given
        path = lexical.resolve()
        return check_draft_dir(path, trust_remote_code=trust_remote_code), None
    except ModelDirError as exc:
        if path.is_dir():
            return None, str(exc)
    except (OSError, ValueError, RuntimeError) as exc:  # a NUL byte, a name too long, ~unknown-user
        return None, f"draft {raw!r:.200} is not a usable path: {exc}"
    tried = str(path) if path == lexical else f"{path} (resolved from {lexical})"
    problem = f"draft model directory {raw!r} does not exist: tried {tried}"
    if not given.is_absolute():
        problem += f"; relative paths are resolved against the YAML file's folder {base}"
        in_cwd = Path.cwd() / given
        try:
            elsewhere = in_cwd.resolve() != path and in_cwd.is_dir()
        except OSError:
            elsewhere = False
        if elsewhere:
            problem += f", not the current directory (where {in_cwd} exists): write that path instead"
    return None, problem
