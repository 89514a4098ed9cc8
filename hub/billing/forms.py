from __future__ import annotations

from decimal import Decimal

from django import forms

from hub.billing.money import MICROS_PER_UNIT, micros_from_units


class AdjustBalanceForm(forms.Form):
    amount = forms.DecimalField(
        max_digits=18,
        decimal_places=6,
        help_text="In dollars, up to six decimal places; negative takes money away.",
    )
    reason = forms.CharField(
        max_length=500,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="Kept in the ledger with your name; the person may be shown it.",
    )

    def clean_amount(self) -> Decimal:
        amount: Decimal = self.cleaned_data["amount"]
        if amount == 0:
            raise forms.ValidationError("An adjustment of zero changes nothing.")
        if abs(amount) * MICROS_PER_UNIT >= 2**62:
            raise forms.ValidationError("That amount is too large.")
        return amount

    def clean_reason(self) -> str:
        reason = self.cleaned_data["reason"].strip()
        if not reason:
            raise forms.ValidationError("Say why.")
        return reason

    @property
    def amount_micros(self) -> int:
        return micros_from_units(self.cleaned_data["amount"])


class MarkPaidForm(forms.Form):
    reference = forms.CharField(
        max_length=200,
        help_text="The transfer's reference (bank or processor), kept with the payout and in "
        "the ledger.",
    )
