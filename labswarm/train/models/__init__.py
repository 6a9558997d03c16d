"""Registered models: ``cnn`` (mel spectrogram), ``mlp`` (MFCC statistics) and ``code`` (a network from a Python
file); installed packages add theirs through the ``labswarm.models`` entry-point group (:mod:`labswarm.registry`)."""

from labswarm.train.models.base import MODELS, Model, ModelConfig, register_model
from labswarm.train.models.cnn import CNN, CNNConfig
from labswarm.train.models.code import CodeModel, CodeModelConfig
from labswarm.train.models.mlp import MLP, MLPConfig

__all__ = ["CNN", "MLP", "MODELS", "CNNConfig", "CodeModel", "CodeModelConfig", "MLPConfig", "Model", "ModelConfig",
           "register_model"]
