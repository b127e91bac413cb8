ALTER TABLE `nodes` ADD `unreachable_since` integer;--> statement-breakpoint
ALTER TABLE `nodes` ADD `unreachable_reason` text;