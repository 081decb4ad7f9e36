"""The example TC programs shipped with tcmlir (data: ``*.tc``; listed by ``tcmlir examples``)."""
