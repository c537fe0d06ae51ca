"""The ground every other package stands on: configuration, errors, model locations, WAV files.

Imports nothing of the product's other packages (docs/architecture.md, "Layers").
"""
