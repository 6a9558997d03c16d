"""The data pipeline: the workers' features block, and the training chain of blocks with its prefetcher."""

from labswarm.pipeline.base import BLOCKS, SKIPPED, Block, BlockConfig, Context, chain, register_block
from labswarm.pipeline.pipeline import Pipeline
from labswarm.pipeline.prefetch import PipelineError, Prefetcher

__all__ = [
    "BLOCKS", "SKIPPED", "Block", "BlockConfig", "Context", "Pipeline", "PipelineError", "Prefetcher",
    "chain", "register_block",
]
