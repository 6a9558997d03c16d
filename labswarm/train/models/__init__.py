"""Registered models: ``cnn`` (mel spectrogram) and ``mlp`` (MFCC statistics)."""

from labswarm.train.models.base import MODELS, Model, ModelConfig, register_model
from labswarm.train.models.cnn import CNN, CNNConfig
from labswarm.train.models.mlp import MLP, MLPConfig

__all__ = ["CNN", "MLP", "MODELS", "CNNConfig", "MLPConfig", "Model", "ModelConfig", "register_model"]
