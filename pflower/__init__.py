"""The support layer every part uses: ``config`` (the validated run config),
``data`` (datasets, partitions, recipes), ``privacy`` (site policy, disclosures,
SecAgg+), ``store`` (personal state on disk), ``results`` (reference figures),
``patches`` (every patched Flower or torch internal) and ``cli`` (check, run)."""
