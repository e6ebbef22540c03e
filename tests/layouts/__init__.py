"""Tests of zkl/layouts/."""
