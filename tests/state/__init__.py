"""Tests of zkl/state/."""
