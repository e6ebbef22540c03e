"""Tests of zkl/run/."""
