"""The tool of the tool demo (+recipe=tiny_tools, logicrl/data/role_tool_task.py): a function tool, its schema
read from the type hints and the docstring. The roles come from each row's extra_info.tools_kwargs."""

from logicrl.data.role_tool_task import tool_answer


def lookup(name: str, **kwargs) -> str:
    """Look up whether an islander is a knight or a knave.

    Args:
        name: The islander's name.
    """
    role = (kwargs.get("roles") or {}).get(name)
    return tool_answer(name, role) if role else f"No record of {name}."
