"""posttrain: post-training scaling with RL on verifiable tasks across hundreds of task types."""

__version__ = "0.1.0"
