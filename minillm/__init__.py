"""minillm: the mini-LLM that the course builds, one component per chapter.

Chapter modules are generated from the solution notebooks (``make package``); the
infrastructure modules ``course``, ``coursemap`` and ``data`` are plain code. Importing
``minillm`` loads no submodule: import the component you need, for example
``from minillm.config import ModelConfig``.
"""

__version__ = "0.1.0"
