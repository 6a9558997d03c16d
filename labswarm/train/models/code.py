"""``code``: a network from a Python file, ``model: {code: my_net.py:Net, input: mel, params: {...}}``.

The file is imported when the model is built (never when the experiment is validated), so it runs arbitrary code
on the machine that trains: allowed on the user's own machine (``labswarm train``, ``labswarm run`` on the
embedded manager) and, on a shared manager, in an admin's jobs only (a user's is refused with 403, as the
``command`` framework is: :meth:`labswarm.jobs.service.service.JobService.validate`). To share a model, publish
it as a package with a ``labswarm.models`` entry point instead (``docs/guides/plugins.md``).

The contract: ``Net`` is a ``torch.nn.Module`` class called as ``Net(n_bins=..., n_classes=..., **params)``;
it takes float32 ``(batch, n_bins, frames)`` (any ``frames``) and returns logits ``(batch, n_classes)``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from pydantic import Field

from labswarm.errors import ConfigError
from labswarm.train.models.base import Model, ModelConfig, import_torch, register_model

#: ``FILE.py:Class``.
CODE_PATTERN = r"^.+\.py:[A-Za-z_][A-Za-z0-9_]*$"


class CodeModelConfig(ModelConfig):
    """Parameters of the ``code`` model.

    Attributes:
        code: ``FILE.py:Class``; a relative ``FILE`` is relative to the experiment's YAML file.
        input: the feature to read (default ``mel``).
        params: keyword arguments of the class besides ``n_bins`` and ``n_classes``.
    """

    name: str = "code"
    code: str = Field(pattern=CODE_PATTERN)
    input: str = "mel"
    params: dict[str, Any] = Field(default_factory=dict)

    @property
    def file(self) -> Path:
        """The Python file."""
        return Path(self.code.rsplit(":", 1)[0])


@register_model
class CodeModel(Model[CodeModelConfig]):
    """The ``torch.nn.Module`` class a :class:`CodeModelConfig` names, built with its ``params``."""

    name = "code"
    config_model = CodeModelConfig

    def build(self, n_bins: int, n_classes: int) -> Any:
        """Raises:
            ConfigError: the file cannot be imported, lacks the class, or the class rejects the parameters
                (``model.code``, ``model.params``).
        """
        torch = import_torch()
        cls = load_class(self.config.code)
        try:
            net = cls(n_bins=n_bins, n_classes=n_classes, **self.config.params)
        except TypeError as exc:
            raise ConfigError([("model.params", f"{self.config.code} rejects them: {exc}")]) from exc
        if not isinstance(net, torch.nn.Module):
            raise ConfigError([("model.code", f"{self.config.code} is not a torch.nn.Module class")])
        return net


def load_class(code: str) -> Any:
    """The class ``FILE.py:Class`` names, its file imported as a module of its own (named after the file's path,
    so two files of one name do not clash; imported once per process).

    Raises:
        ConfigError: no such file, an error while importing it, or no such class (``model.code``).
    """
    file, _, attr = code.rpartition(":")
    path = Path(file).resolve()
    if not path.is_file():
        raise ConfigError([("model.code", f"no such file: {path}")])
    module_name = f"labswarm_user_model_{hashlib.blake2b(str(path).encode(), digest_size=6).hexdigest()}"
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise ConfigError([("model.code", f"cannot import {path}")])
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:  # the user's file: any error of theirs, named
            raise ConfigError([("model.code", f"importing {path} failed: {type(exc).__name__}: {exc}")]) from exc
        sys.modules[module_name] = module
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ConfigError([("model.code", f"{path} has no {attr!r}")]) from None
