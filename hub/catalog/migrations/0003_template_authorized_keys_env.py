from typing import Any

from django.db import migrations, models

OLD_COMMAND = [
    "bash",
    "-c",
    "apt-get update -qq && apt-get install -y -qq openssh-server >/dev/null && "
    'mkdir -p /run/sshd /root/.ssh && echo "$PUBLIC_KEY" > /root/.ssh/authorized_keys && '
    "exec /usr/sbin/sshd -D -e",
]
# The keys first (a renter's own PUBLIC_KEY and their account's keys, one per line), with the
# modes sshd's StrictModes wants, then the server.
NEW_COMMAND = [
    "bash",
    "-c",
    "mkdir -p /run/sshd /root/.ssh && chmod 700 /root/.ssh && "
    'printf "%s\\n" "$PUBLIC_KEY" > /root/.ssh/authorized_keys && '
    "chmod 600 /root/.ssh/authorized_keys && "
    "apt-get update -qq && apt-get install -y -qq openssh-server >/dev/null && "
    "exec /usr/sbin/sshd -D -e",
]
OLD_DESCRIPTION = "Plain Ubuntu 24.04 with an SSH server on port 22 (set PUBLIC_KEY)."
NEW_DESCRIPTION = (
    "Plain Ubuntu 24.04 with an SSH server on port 22; your account's SSH keys are let in"
    " (ssh through the gateway: see the rental's page)."
)


def take_account_keys(apps: Any, schema_editor: Any) -> None:
    Template = apps.get_model("catalog", "Template")
    template = Template.objects.filter(slug="ubuntu-ssh").first()
    if template is None:
        return
    template.authorized_keys_env = "PUBLIC_KEY"
    # An admin's own edits stay.
    if template.command == OLD_COMMAND:
        template.command = NEW_COMMAND
    if template.description == OLD_DESCRIPTION:
        template.description = NEW_DESCRIPTION
    template.save(update_fields=["authorized_keys_env", "command", "description"])


class Migration(migrations.Migration):
    dependencies = [
        ("catalog", "0002_seed_templates"),
    ]

    operations = [
        migrations.AddField(
            model_name="template",
            name="authorized_keys_env",
            field=models.CharField(blank=True, max_length=128),
        ),
        migrations.RunPython(take_account_keys, migrations.RunPython.noop),
    ]
