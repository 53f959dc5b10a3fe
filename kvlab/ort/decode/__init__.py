"""The decode room: one step and the loop around it. The slots (``slots``) a cache is made of, the caches
(``caches``, ``capture``), the greedy token kept on the device (``greedy``), one step (``stepper``) and the
generation loop (``generate``). Imports the runtime and models rooms."""
