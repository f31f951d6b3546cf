"""Quicksilver: gradient-communication scheduling for data-parallel training.

`quicksilver.torch` trains PyTorch models through Quicksilver's schedulers (docs/pytorch.md).
"""
__all__ = ["torch"]
