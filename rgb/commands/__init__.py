"""The command layer: the only package that reads Hydra configs. Each command turns its composed config into one
typed request and calls the library function that takes it; nothing below this package sees a DictConfig.

Importing it loads nothing heavy (torch, Lightning): the modules are imported by the commands that need them.
"""
