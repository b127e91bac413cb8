ALTER TABLE `apps` ADD `live_instances` text;--> statement-breakpoint
ALTER TABLE `apps` ADD `instances` integer DEFAULT 1 NOT NULL;--> statement-breakpoint
ALTER TABLE `apps` ADD `autoscaling` text;--> statement-breakpoint
ALTER TABLE `apps` ADD `scale_events` text;--> statement-breakpoint
ALTER TABLE `deployments` ADD `instances` integer;