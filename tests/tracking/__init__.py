"""Tests of zkl/tracking/."""
