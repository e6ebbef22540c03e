"""Tests of zkl/ops/."""
