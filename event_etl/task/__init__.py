"""What an executor task does with a split: read its payloads, decode and check them, judge them
against the batch's watermark, drop duplicates, write the hourly files, and report back."""
