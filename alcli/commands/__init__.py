"""The commands of `alcli`, one module each; options.py declares the options they share and
shared.py what each command does around its call into alcli.api (settings, reporting)."""
