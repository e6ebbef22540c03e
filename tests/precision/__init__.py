"""Tests of zkl/precision/."""
