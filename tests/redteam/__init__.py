"""The red-team generator and its runner (issue #19): see generate.py."""
