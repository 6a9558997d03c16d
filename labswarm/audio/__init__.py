"""Audio: loading and segmenting (``io``), augmentations (``transforms``), feature extractors (``features``)."""
