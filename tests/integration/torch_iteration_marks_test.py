"""zicoum.torch.mark_iterations() marks an iteration after each step of the
first optimizer that steps, on the CPU: a stand-in `torch` package offers
PyTorch's global optimizer step post-hook (torch.optim.optimizer, 2.0+).
zicoum's own count of marks (stats()["iterations"]) must follow the steps of
the first optimizer only, stop when the hook is removed, and a PyTorch
without the hook is refused with a reason.
    torch_iteration_marks_test.py   (PYTHONPATH holds the zicoum package)
"""
import os
import sys
import tempfile
import textwrap

FAKE_TORCH = {
    "torch/__init__.py": """
        __version__ = "stand-in"
        from . import optim
        """,
    "torch/optim/__init__.py": """
        from . import optimizer
        from .optimizer import Optimizer
        """,
    "torch/optim/optimizer.py": """
        _hooks = {}
        _next = [0]
        class RemovableHandle:
            def __init__(self, key):
                self.key = key
            def remove(self):
                _hooks.pop(self.key, None)
        def register_optimizer_step_post_hook(hook):
            _next[0] += 1
            _hooks[_next[0]] = hook
            return RemovableHandle(_next[0])
        class Optimizer:
            def step(self):
                for hook in list(_hooks.values()):
                    hook(self, (), {})
        """,
}

OLD_TORCH = {
    "torch/__init__.py": "from . import optim\n",
    "torch/optim/__init__.py": "from . import optimizer\n",
    "torch/optim/optimizer.py": "class Optimizer:\n    pass\n",
}


def write(root, files):
    for path, text in files.items():
        os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
        with open(os.path.join(root, path), "w") as out:
            out.write(textwrap.dedent(text))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--old-torch":
        root = tempfile.mkdtemp(prefix="zicoum-old-torch-")
        write(root, OLD_TORCH)
        sys.path.insert(0, root)
        import zicoum.torch
        try:
            zicoum.torch.mark_iterations()
            raise AssertionError("a PyTorch without optimizer step hooks was accepted")
        except RuntimeError as error:
            assert "register_optimizer_step_post_hook" in str(error), error
        print("OK")
        return

    root = tempfile.mkdtemp(prefix="zicoum-torch-")
    write(root, FAKE_TORCH)
    sys.path.insert(0, root)
    os.environ.update({"ZICO_SOCKET": "off", "ZICO_BACKEND": "sim", "ZICO_BUDGET": "64MiB"})
    import torch
    import zicoum
    import zicoum.torch

    marks = lambda: zicoum.stats(0)["iterations"]
    handle = zicoum.torch.mark_iterations()
    assert zicoum.torch.mark_iterations() is handle, "a second call installed a second hook"
    before = marks()
    model, critic = torch.optim.Optimizer(), torch.optim.Optimizer()
    for _ in range(3):
        model.step()
        critic.step()  # a second optimizer in the same iteration: no second mark
    assert marks() == before + 3, f"3 iterations of two optimizers gave {marks() - before} marks"
    handle.remove()
    model.step()
    assert marks() == before + 3, "a step marked an iteration after the hook was removed"
    again = zicoum.torch.mark_iterations()
    assert again is not handle, "the removed hook was handed out again"
    critic.step()
    assert marks() == before + 4, "a hook installed again did not mark"
    again.remove()
    print("OK")


if __name__ == "__main__":
    main()
