# Jupyter server configuration shared by both views of `python3 run.py lab` (student and
# instructor); run.py puts this folder on JUPYTER_CONFIG_PATH for that launch only.
#
# Opening a lesson must not mark it as modified. The lessons store the kernel's language only
# (`"language_info": {"name": "python"}`); when the kernel starts, JupyterLab writes the kernel's
# full language_info (version, mimetype, codemirror mode, ...) into the notebook's metadata, and
# that change alone marks the tab modified. Here a notebook whose language_info is a part of what
# this server's own Python kernel reports is handed to JupyterLab with the kernel's complete
# language_info, so the kernel's reply changes nothing. The file on disk is not touched until the
# student saves (which would write the same metadata anyway).
from ipykernel.ipkernel import IPythonKernel
from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager

c = get_config()  # noqa: F821 - provided by traitlets when it loads this file

#: What the course's kernel (ipykernel in this same environment) reports as its language_info.
KERNEL_LANGUAGE_INFO = dict(IPythonKernel.language_info)


class CourseContentsManager(AsyncLargeFileManager):
    """Serves notebooks with the language_info their Python kernel will report."""

    async def get(self, path, content=True, type=None, format=None, **kwargs):  # noqa: A002
        model = await super().get(path, content=content, type=type, format=format, **kwargs)
        if model.get("type") == "notebook" and isinstance(model.get("content"), dict):
            meta = model["content"].setdefault("metadata", {})
            info = meta.get("language_info")
            spec = meta.get("kernelspec") or {}
            if (
                spec.get("name") == "python3"
                and isinstance(info, dict)
                and all(KERNEL_LANGUAGE_INFO.get(k) == v for k, v in info.items())
            ):
                meta["language_info"] = dict(KERNEL_LANGUAGE_INFO)
        return model


c.ServerApp.contents_manager_class = CourseContentsManager
