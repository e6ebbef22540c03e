"""Tests of zkl/megatron/."""
