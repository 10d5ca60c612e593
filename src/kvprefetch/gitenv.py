"""The environment names that tell git where a repository, its work tree, index and objects
are (git's own ``git rev-parse --local-env-vars``, less the user's configuration
``GIT_CONFIG_*``). A user's ``GIT_WORK_TREE`` (a dotfiles setup's ``$HOME``) or ``GIT_DIR``
set in the shell must not steer the kit's own git: ``fetch``'s clone (``sources.gitpython``)
and the kit's commit it records (``kitinfo``) leave them out (issue 41, the twenty-eighth
hostile pass)."""

from __future__ import annotations

REPO_ENV = ("GIT_DIR", "GIT_WORK_TREE", "GIT_IMPLICIT_WORK_TREE", "GIT_INDEX_FILE",
            "GIT_OBJECT_DIRECTORY", "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_COMMON_DIR",
            "GIT_GRAFT_FILE", "GIT_SHALLOW_FILE", "GIT_NO_REPLACE_OBJECTS",
            "GIT_REPLACE_REF_BASE", "GIT_PREFIX", "GIT_NAMESPACE")
