"""TGI adapter (installed as ``accel_plugin.adapters.tgi``): our attention and draft models inside TGI.

TGI (text-generation-inference v3.3.7) loads no plugins, so activation needs no
change to TGI or its launcher but an import hook:

1. The wheel installs ``accel_plugin_tgi.pth`` into site-packages (an editable
   install does not: run ``python -m accel_plugin.adapters.tgi install-hook``).
   While ``ACCEL_ATTENTION_BACKEND`` and ``ACCEL_DRAFT_CONFIG`` are unset it does
   nothing at all; when one is set, it puts a trigger written with the standard
   library alone on ``sys.meta_path`` (:mod:`._startup`), which imports nothing until
   ``text_generation_server`` is imported. Then it removes itself and calls
   :func:`install_import_hook`: a post-import hook for ``text_generation_server.*``
   (:mod:`._hook`).
2. When TGI imports ``text_generation_server.layers.attention``, the hook calls
   :func:`activate` (:mod:`.activation`): it validates the variable (:mod:`accel_plugin.envs`), TGI's
   ``ATTENTION`` (``paged`` or ``flashdecoding-ipex``) and TGI's function signatures,
   builds the process's accel plugins once (:func:`accel_plugin.plugins.manager.process_plugins`),
   asks them what they offer to ``"tgi"`` and selects the backend
   (:func:`accel_plugin.plugins.selection.select_attention_backend`). A refusal raises, so
   TGI does not start with an attention it was not asked for; the message names the
   supported values and the way back (unset the variable).
3. It then applies :data:`._patches.ATTENTION_PATCHES` (the ledger is in
   :mod:`._patches`): ``attention``/``paged_attention`` are rebound in the package and
   in every ``text_generation_server`` module that holds them by name, including
   modules imported later. The first call logs one INFO line through TGI's loguru
   logger (backend, ATTENTION, module count, kernel mode).
4. When TGI imports ``text_generation_server.models.flash_causal_lm`` with
   ``ACCEL_DRAFT_CONFIG`` set, :func:`activate_speculation` wraps
   ``FlashCausalLM.__init__`` and ``.generate_token`` (:data:`._patches.SPECULATION_PATCHES`):
   each model built afterwards validates the draft YAML against itself and TGI's
   ``--speculate``, and drafts with the domain proposer (:mod:`.speculative`);
   :func:`speculation_stats` reads its per-domain counters.

:func:`uninstall` restores every original; :func:`status` (:mod:`.installation`) says
whether the adapter can attach here, and ``accel doctor`` shows it through the
adapter's accel hooks (:mod:`.hooks`, entry point ``accel.tgi``). This module only
gathers the public functions and connects the ledger to the activation it triggers
(:func:`._patches.connect`). Importing this package imports neither torch nor TGI.
"""

from __future__ import annotations

from . import _patches
from ._names import FRAMEWORK
from .activation import activate, activate_speculation, attach_model, install_import_hook, is_active
from .activation import speculation_stats, uninstall
from .installation import hook_file, install_hook_file, remove_hook_file, status

__all__ = [
    "FRAMEWORK",
    "activate",
    "activate_speculation",
    "hook_file",
    "install_hook_file",
    "install_import_hook",
    "is_active",
    "remove_hook_file",
    "speculation_stats",
    "status",
    "uninstall",
]

_patches.connect(activate=activate, activate_speculation=activate_speculation, attach=attach_model)
