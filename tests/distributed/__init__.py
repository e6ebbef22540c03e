"""Tests of zkl/distributed/."""
