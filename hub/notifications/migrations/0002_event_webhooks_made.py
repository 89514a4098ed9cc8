from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("notifications", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="event",
            name="webhooks_made",
            field=models.BooleanField(default=False),
        ),
    ]
